"""filter plugins."""
