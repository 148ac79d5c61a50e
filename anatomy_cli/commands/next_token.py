"""`anatomy next_token` (not implemented yet)."""
