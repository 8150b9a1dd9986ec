"""Login, sessions, request authentication, registration, password reset, API keys, allowed IPs."""
