"""Built-in services."""
