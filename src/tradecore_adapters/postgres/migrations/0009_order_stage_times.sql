-- The two moments of an order's life that were not recorded: when its checks passed and the
-- intent was written (admitted_at; created_at is when the request arrived) and when the
-- broker answered its placement (placed_at; submitted_at is the worker's claim). Older rows
-- keep NULL: the dashboard says "not recorded" for them.
ALTER TABLE order_history
    ADD COLUMN admitted_at timestamptz,
    ADD COLUMN placed_at timestamptz;
