"""scorer plugins."""
