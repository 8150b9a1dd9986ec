-- The tamper-evident audit chain (tradecore/audit_chain.py): every entry carries the seal of
-- the entry before it and its own; the head row holds the newest seal and is moved with a
-- compare-and-set in the same statement that inserts the entry, so entries from every process
-- form one chain in id order.
ALTER TABLE audit_logs
    ADD COLUMN previous_seal text CHECK (previous_seal ~ '^[0-9a-f]{64}$'),
    ADD COLUMN seal text CHECK (seal ~ '^[0-9a-f]{64}$');

CREATE TABLE audit_chain_head (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    seal text NOT NULL CHECK (seal ~ '^[0-9a-f]{64}$')
);
INSERT INTO audit_chain_head (seal) VALUES (repeat('0', 64));
