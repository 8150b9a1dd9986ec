-- 0005: a session's latest refresh-token rotation: the digest of the refresh token id it
-- retired and when. A retired token presented again within a few seconds (two browser tabs
-- refreshing at once) gets the same successor instead of revoking the session.
ALTER TABLE user_sessions
    ADD COLUMN previous_refresh_jti text,
    ADD COLUMN refresh_rotated_at timestamptz,
    ADD CONSTRAINT user_sessions_rotation_whole
        CHECK ((previous_refresh_jti IS NULL) = (refresh_rotated_at IS NULL));
