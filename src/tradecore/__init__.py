"""tradecore."""
