"""Data loaders selectable by name in config: data_loader.type."""
