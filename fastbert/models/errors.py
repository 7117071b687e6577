"""The error a model's config raises; config.py and registry.py both raise it (and config.py
re-exports it, where callers import it from)."""


class ConfigError(ValueError):
    """A config.json that fastbert cannot use (unreadable, or a setting it does not support)."""
