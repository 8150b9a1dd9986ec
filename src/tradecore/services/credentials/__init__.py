"""Broker credentials: sealing uploads for storage, and opening them for a broker connection
(the worker's, and the API's credential check)."""
