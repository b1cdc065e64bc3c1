"""How a config file becomes checked values: reading, overrides and defaults (load_config), the
value checks the schema uses (config_checks), the monitored metric's name (monitor), the
keywords a configured class takes (keywords), docs/config.md's key tables (schema_docs). The
schema itself is config_schema.py and the parser parse_config.py, at the top of the repository.
Edited only to add a config key's check."""
