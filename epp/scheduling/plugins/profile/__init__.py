"""profile plugins."""
