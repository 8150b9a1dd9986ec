-- 0001: the initial schema. Ids are the caller's UUID strings (text); audit ids are assigned here.
-- Money and quantities are NUMERIC, times timestamptz, enumerations text with CHECK constraints,
-- addresses inet. Secrets appear only as SHA-256 hex digests.

CREATE TABLE users (
    id text PRIMARY KEY,
    email text NOT NULL,
    -- the case-folded e-mail (Python str.casefold, computed by the adapter): unique
    email_key text NOT NULL,
    password_hash text NOT NULL,
    plan text NOT NULL CHECK (plan IN ('free', 'pro')),
    created_at timestamptz NOT NULL,
    disabled boolean NOT NULL DEFAULT false,
    subscription_expires_at timestamptz,
    accepted_terms_version text
);
CREATE UNIQUE INDEX users_email_key ON users (email_key);

CREATE TABLE user_sessions (
    id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    csrf_token text NOT NULL,
    ip_address inet NOT NULL,
    user_agent text NOT NULL,
    created_at timestamptz NOT NULL,
    is_active boolean NOT NULL DEFAULT true,
    refresh_jti text,
    revoked_at timestamptz
);
CREATE INDEX user_sessions_active_by_user ON user_sessions (user_id) WHERE is_active;

CREATE TABLE api_keys (
    id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name text NOT NULL,
    key_hash text NOT NULL,
    prefix text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    last_used_at timestamptz,
    revoked_at timestamptz,
    seq bigint GENERATED ALWAYS AS IDENTITY  -- insertion order, the tie-break of listings
);
CREATE UNIQUE INDEX api_keys_key_hash ON api_keys (key_hash);
CREATE INDEX api_keys_by_user ON api_keys (user_id, created_at, seq);

CREATE TABLE user_allowed_ips (
    id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    ip_address inet NOT NULL,  -- an address or a CIDR block, normalized by the core
    created_at timestamptz NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    CONSTRAINT user_allowed_ips_unique UNIQUE (user_id, ip_address)
);

CREATE TABLE trading_accounts (
    id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name text NOT NULL,
    broker_name text NOT NULL,
    webhook_token_hash text NOT NULL,
    webhook_secret_hash text NOT NULL,
    created_at timestamptz NOT NULL,
    max_request_age integer NOT NULL,
    allowed_symbols text[] NOT NULL DEFAULT '{}',
    max_quantity numeric NOT NULL,
    credentials_verified boolean NOT NULL DEFAULT false,
    deleted boolean NOT NULL DEFAULT false,
    seq bigint GENERATED ALWAYS AS IDENTITY
);
-- layer 1 of the webhook check: one index probe per request
CREATE UNIQUE INDEX trading_accounts_webhook_token ON trading_accounts (webhook_token_hash);
CREATE INDEX trading_accounts_by_user ON trading_accounts (user_id, created_at, seq)
    WHERE NOT deleted;

CREATE TABLE order_history (
    id text COLLATE "C" PRIMARY KEY,
    -- orders are records of money moved: deleting their user or account is refused
    user_id text NOT NULL REFERENCES users (id),
    trading_account_id text NOT NULL REFERENCES trading_accounts (id),
    broker_name text NOT NULL,
    symbol text NOT NULL,
    action text NOT NULL
        CHECK (action IN ('buy', 'sell', 'close_long', 'close_short')),
    quantity numeric NOT NULL,
    order_type text NOT NULL CHECK (order_type IN ('entry', 'exit')),
    source text NOT NULL CHECK (source IN ('webhook', 'dashboard')),
    simulation boolean NOT NULL,
    status text NOT NULL CHECK (status IN (
        'queued', 'submitted', 'pending', 'partially_filled', 'filled',
        'cancelled', 'rejected', 'failed', 'expired', 'no_position'
    )),
    created_at timestamptz NOT NULL,
    request_id text NOT NULL,
    fingerprint text,
    order_id text,
    client_order_id text,
    broker_refs text[] NOT NULL DEFAULT '{}',
    submitted_at timestamptz,
    fill_price numeric,
    fill_quantity numeric NOT NULL DEFAULT 0,
    filled_at timestamptz,
    auto_exit boolean NOT NULL DEFAULT false,
    exit_quantity numeric NOT NULL DEFAULT 0,
    position_before numeric,
    exit_order_result jsonb,
    error jsonb  -- {"code", "message", "retry_after"}
);
-- backs the replay store: a replayed webhook never becomes a second order, even after Redis
-- lost its key (docs/security.md). A transition that sets fingerprint NULL frees it.
CREATE UNIQUE INDEX order_history_fingerprint ON order_history (user_id, fingerprint)
    WHERE fingerprint IS NOT NULL;
CREATE INDEX order_history_by_user ON order_history (user_id, created_at DESC, id DESC);
CREATE INDEX order_history_by_account
    ON order_history (trading_account_id, created_at DESC, id DESC);

CREATE TABLE audit_logs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text,  -- no foreign key: the log outlives what it describes
    -- a name, not a list: a new action in the code must never make an audit write fail
    action text NOT NULL CHECK (action ~ '^[a-z][a-z0-9_]*$'),
    success boolean NOT NULL,
    ip_address inet NOT NULL,
    user_agent text NOT NULL,
    request_path text NOT NULL,
    request_method text NOT NULL,
    error_message text,
    resource_type text,
    resource_id text,
    metadata jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL
);
CREATE INDEX audit_logs_user_time ON audit_logs (user_id, created_at DESC);

CREATE TABLE password_reset_tokens (
    token_hash text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY  -- issue order: the oldest are dropped first
);
CREATE INDEX password_reset_tokens_by_user ON password_reset_tokens (user_id, seq);
CREATE INDEX password_reset_tokens_expiry ON password_reset_tokens (expires_at);

-- named JSON documents (the paper broker's state in real mode)
CREATE TABLE documents (
    name text PRIMARY KEY,
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
