"""picker plugins."""
