"""`anatomy layernorm` (not implemented yet)."""
