"""`anatomy tokens` (not implemented yet)."""
