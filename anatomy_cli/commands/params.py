"""`anatomy params` (not implemented yet)."""
