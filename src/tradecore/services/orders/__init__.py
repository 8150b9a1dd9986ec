"""Orders: the webhook and dashboard intake, their checks, the hand-over to the worker."""
