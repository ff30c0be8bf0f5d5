"""The package's error for bad configuration, in a module that imports nothing: the plan, the studies' declarations
and the report raise it without pulling in Hydra (opdgrpo.config composes conf/ with Hydra and re-exports it)."""


class ConfigError(ValueError):
    """A problem in the configuration, with the key that causes it and what would fix it."""
