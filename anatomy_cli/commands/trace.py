"""`anatomy trace` (not implemented yet)."""
