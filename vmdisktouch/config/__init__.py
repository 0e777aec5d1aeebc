"""The settings: each defined once, read from flags, the config file and its overrides."""
