-- 0004: the venue environment and symbol aliases of a trading account. testnet selects the
-- venue's test or paper environment (Binance testnet, Bybit testnet, Alpaca paper);
-- symbol_map maps the names a user's alerts send (TradingView's ES1!) to the venue's ids.
ALTER TABLE trading_accounts
    ADD COLUMN testnet boolean NOT NULL DEFAULT false,
    ADD COLUMN symbol_map jsonb NOT NULL DEFAULT '{}'::jsonb
        CHECK (jsonb_typeof(symbol_map) = 'object');
