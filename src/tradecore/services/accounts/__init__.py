"""Trading accounts: creating, reading, changing and deleting them, and their credentials."""
