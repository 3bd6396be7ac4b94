"""drain."""
