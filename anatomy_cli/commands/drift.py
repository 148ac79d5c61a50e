"""`anatomy drift` (not implemented yet)."""
