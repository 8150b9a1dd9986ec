"""tradecore_entrypoints."""
