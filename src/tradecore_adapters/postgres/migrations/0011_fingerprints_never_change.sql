-- An order's fingerprint never changes any more: the API no longer withdraws an intent it
-- could not hand over (which freed the fingerprint); the worker hosts' recovery hands it over
-- instead. The trigger that made a freed fingerprint follow into order_keys (0010) goes.
DROP TRIGGER order_history_fingerprint_follows ON order_history;
DROP FUNCTION order_keys_follow_fingerprint();
