"""The one error type for configuration problems."""


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and what is allowed."""
