"""prefix plugins."""
