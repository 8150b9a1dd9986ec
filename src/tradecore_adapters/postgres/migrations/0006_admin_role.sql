-- 0006: the administrator role. An administrator may use the operator endpoints (/setup/*
-- after the first-run setup, /deployment/*). Existing users are not administrators; the
-- first-run setup or `tradecore admin create-user --admin` makes one.
ALTER TABLE users
    ADD COLUMN is_admin boolean NOT NULL DEFAULT false;
