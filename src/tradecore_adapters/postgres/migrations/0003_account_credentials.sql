-- 0003: broker credentials at rest. Only the AES-256-GCM ciphertext is stored (format byte,
-- 96-bit nonce, ciphertext, tag; the account id is its associated data), never the credentials;
-- NULL when the account has none (the paper broker needs none).
ALTER TABLE trading_accounts
    ADD COLUMN encrypted_credentials bytea
        CHECK (encrypted_credentials IS NULL OR octet_length(encrypted_credentials) >= 29);
