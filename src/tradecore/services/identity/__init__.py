"""Who the caller is: the bot challenge, login, a session's tokens, request authentication."""
