-- 0010: order_history and audit_logs partitioned by month of created_at (UTC), so that old
-- months can be dropped whole by the retention job (`tradecore partitions`,
-- tradecore_adapters/postgres/partitions.py) instead of deleted row by row.
--
-- Both tables are rebuilt: the existing rows are copied into the new partitioned table inside
-- this migration's transaction (the migrator runs every pending file in one transaction), so a
-- failure leaves the 0009 schema and every row as they were.
--
-- What partitioning would break, and what keeps it:
-- * A unique index on a partitioned table must contain the partition key, so neither
--   UNIQUE (id) nor UNIQUE (user_id, fingerprint) can be enforced on order_history any more
--   (an order at 23:59:59 on the 31st and its replay at 00:00:01 land in two partitions).
--   Both move to order_keys, one narrow row per order in a table that is not partitioned:
--   its primary key keeps ids globally unique and its partial unique index refuses a
--   replayed fingerprint whatever month the first order is in. The order adapter writes the
--   order_keys row and the order row in one statement (the order row is inserted only if
--   the key row was), and a trigger makes a change of order_history.fingerprint (the
--   withdrawal sets it NULL, which frees it) follow in order_keys.
-- * order_keys also holds each order's created_at: a lookup by id reads it first and the
--   order row is then found in its one partition (run-time pruning), however many months
--   the table holds (ids are random UUIDs, so they cannot be pruned on).
-- * audit_logs keeps its identity column (one sequence, continued from where 0009 left it):
--   ids stay increasing, and the chain (0002) is untouched. The retention job records in
--   audit_chain_anchor where it cut the chain, so `verify-audit` starts from there.
-- * Each table gets a DEFAULT partition: a row whose month has no partition yet (the job
--   did not run) is stored there rather than refused; the job moves such rows into their
--   month's partition.

-- The keys of every order, global (not partitioned).
CREATE TABLE order_keys (
    id text COLLATE "C" PRIMARY KEY,
    user_id text NOT NULL,
    created_at timestamptz NOT NULL,
    fingerprint text
);
CREATE UNIQUE INDEX order_keys_fingerprint ON order_keys (user_id, fingerprint)
    WHERE fingerprint IS NOT NULL;

-- Where retention cut the audit chain: the id and seal of the newest entry removed. The
-- oldest retained entry must carry that seal as its previous seal.
CREATE TABLE audit_chain_anchor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_id bigint NOT NULL,
    seal text NOT NULL CHECK (seal ~ '^[0-9a-f]{64}$'),
    retained_from timestamptz NOT NULL,  -- the start of the oldest month kept
    recorded_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE order_history RENAME TO order_history_0009;
ALTER TABLE audit_logs RENAME TO audit_logs_0009;

-- The same columns, defaults, NOT NULLs and CHECKs (with their names); keys, indexes and
-- foreign keys are added once the rows are in.
CREATE TABLE order_history (LIKE order_history_0009 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
CREATE TABLE audit_logs (
    LIKE audit_logs_0009 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY
) PARTITION BY RANGE (created_at);

-- One partition per UTC month that holds rows, the current month and the next two, and the
-- DEFAULT partition. Named <table>_YYYY_MM; the bounds are UTC midnights.
DO $$
DECLARE
    parent text;
    month timestamp;  -- the month's first instant in UTC, as a UTC wall-clock time
BEGIN
    FOREACH parent IN ARRAY ARRAY['order_history', 'audit_logs'] LOOP
        FOR month IN EXECUTE format(
            'SELECT DISTINCT date_trunc(''month'', created_at AT TIME ZONE ''UTC'') FROM %I'
            ' UNION SELECT date_trunc(''month'', now() AT TIME ZONE ''UTC'')'
            ' + make_interval(months => n) FROM generate_series(0, 2) AS n ORDER BY 1',
            parent || '_0009')
        LOOP
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                parent || '_' || to_char(month, 'YYYY_MM'), parent,
                to_char(month, 'YYYY-MM-DD') || ' 00:00:00+00',
                to_char(month + interval '1 month', 'YYYY-MM-DD') || ' 00:00:00+00');
        END LOOP;
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', parent || '_default', parent);
    END LOOP;
END
$$;

INSERT INTO order_history (
    id, user_id, trading_account_id, broker_name, symbol, action, quantity, order_type,
    source, simulation, status, created_at, request_id, fingerprint, order_id,
    client_order_id, broker_refs, submitted_at, fill_price, fill_quantity, filled_at,
    auto_exit, exit_quantity, position_before, exit_order_result, error, admitted_at,
    placed_at
)
SELECT
    id, user_id, trading_account_id, broker_name, symbol, action, quantity, order_type,
    source, simulation, status, created_at, request_id, fingerprint, order_id,
    client_order_id, broker_refs, submitted_at, fill_price, fill_quantity, filled_at,
    auto_exit, exit_quantity, position_before, exit_order_result, error, admitted_at,
    placed_at
FROM order_history_0009;
INSERT INTO order_keys (id, user_id, created_at, fingerprint)
SELECT id, user_id, created_at, fingerprint FROM order_history_0009;

INSERT INTO audit_logs (
    id, user_id, action, success, ip_address, user_agent, request_path, request_method,
    error_message, resource_type, resource_id, metadata, created_at, previous_seal, seal
)
OVERRIDING SYSTEM VALUE
SELECT
    id, user_id, action, success, ip_address, user_agent, request_path, request_method,
    error_message, resource_type, resource_id, metadata, created_at, previous_seal, seal
FROM audit_logs_0009;
-- the identity continues after every id 0009 handed out (a rolled-back append used one too)
SELECT setval(
    pg_get_serial_sequence('audit_logs', 'id'),
    greatest(
        (SELECT max(id) FROM audit_logs_0009),
        (SELECT CASE WHEN is_called THEN last_value END FROM audit_logs_id_seq),
        1
    ),
    EXISTS (SELECT FROM audit_logs_0009)
        OR (SELECT is_called FROM audit_logs_id_seq)
);

DROP TABLE order_history_0009;
DROP TABLE audit_logs_0009;
ALTER SEQUENCE audit_logs_id_seq1 RENAME TO audit_logs_id_seq;

-- Keys and indexes: the names of 0001-0008, the partition key added where uniqueness needs it.
ALTER TABLE order_history ADD CONSTRAINT order_history_pkey PRIMARY KEY (id, created_at);
ALTER TABLE order_history
    ADD CONSTRAINT order_history_user_id_fkey FOREIGN KEY (user_id) REFERENCES users (id),
    ADD CONSTRAINT order_history_trading_account_id_fkey
        FOREIGN KEY (trading_account_id) REFERENCES trading_accounts (id);
CREATE INDEX order_history_by_user ON order_history (user_id, created_at DESC, id DESC);
CREATE INDEX order_history_by_account
    ON order_history (trading_account_id, created_at DESC, id DESC);
CREATE INDEX order_history_queued ON order_history (created_at, id) WHERE status = 'queued';

ALTER TABLE audit_logs ADD CONSTRAINT audit_logs_pkey PRIMARY KEY (id, created_at);
CREATE INDEX audit_logs_user_time ON audit_logs (user_id, created_at DESC);

-- A change of an order's fingerprint (the withdrawal sets it NULL to free it) is made in
-- order_keys too, in the same statement; a change to a fingerprint already taken fails there.
CREATE FUNCTION order_keys_follow_fingerprint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE order_keys SET fingerprint = NEW.fingerprint WHERE id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER order_history_fingerprint_follows
    AFTER UPDATE OF fingerprint ON order_history
    FOR EACH ROW WHEN (OLD.fingerprint IS DISTINCT FROM NEW.fingerprint)
    EXECUTE FUNCTION order_keys_follow_fingerprint();

-- An order's created_at by id. STABLE, so a lookup written
-- `WHERE id = $1 AND created_at = order_created_at($1)` is pruned to one partition when the
-- executor starts (the other partitions are never opened), in a prepared plan too.
CREATE FUNCTION order_created_at(order_id text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS 'SELECT created_at FROM order_keys WHERE id = order_id';
