-- Several orders by id (the fill verifier's batches, PostgresOrderHistory.get_many). The
-- statement reads each id's created_at from order_keys, then its row from its month's
-- partition (a LATERAL probe, pruned at run time). Planned as a custom plan, it is planned
-- again over every partition on each call: 0.35-0.55 ms a call with four partitions, more
-- with a longer retention, and the server keeps choosing custom plans for the short id lists
-- of a quiet system. In this function the statement's plan is made once per connection and
-- kept (a generic plan: the lateral probe prunes the partitions when it runs).
CREATE FUNCTION order_history_rows(order_ids text[]) RETURNS SETOF order_history
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
        SELECT history.* FROM order_keys AS key
        CROSS JOIN LATERAL (
            SELECT * FROM order_history
            WHERE id = key.id AND created_at = key.created_at LIMIT 1
        ) AS history
        WHERE key.id = ANY(order_ids);
END
$$;
