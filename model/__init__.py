"""Models, losses and metrics selectable by name in config."""
