"""Route tables, one module per concern."""
