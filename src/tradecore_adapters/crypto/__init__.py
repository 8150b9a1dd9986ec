"""Cryptographic adapters: Argon2id password hashing (JWT and AES-GCM arrive with the server)."""
