-- close_long and close_short have no order type (the webhook action mapping's "n/a"): they
-- close the whole position, whatever order_type the alert named. They were stored as
-- 'entry'; store NULL for them, and require a type for every buy and sell.
ALTER TABLE order_history ALTER COLUMN order_type DROP NOT NULL;
UPDATE order_history SET order_type = NULL WHERE action IN ('close_long', 'close_short');
ALTER TABLE order_history ADD CONSTRAINT order_history_order_type_for_action
    CHECK ((order_type IS NULL) = (action IN ('close_long', 'close_short')));
