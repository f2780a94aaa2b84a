"""pope-fast."""
