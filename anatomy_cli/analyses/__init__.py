"""Pure functions from captured activations / configs to frozen result dataclasses."""
