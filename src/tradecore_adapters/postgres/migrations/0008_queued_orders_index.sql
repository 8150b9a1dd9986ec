-- The worker hosts' recovery looks for order intents still 'queued' long after they were
-- written (their API died before handing them over). A partial index holds only those rows,
-- normally a handful, so the periodic look costs next to nothing however long the history.
CREATE INDEX order_history_queued ON order_history (created_at, id) WHERE status = 'queued';
