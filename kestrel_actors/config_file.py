"""The path ``kestrel_actors.config_file`` that programs loading a config file have used: the room
is :mod:`kestrel_actors.config`, whose face this hands on."""

from .config import (
    QUEUE_SETTINGS,
    SERVER_SETTINGS,
    ZOOKEEPER_SETTINGS,
    ConfigError,
    ConfigProblem,
    effective_queue_config,
    load_config,
    parse_config,
    resolve_queue_configs,
)

__all__ = [
    "QUEUE_SETTINGS",
    "SERVER_SETTINGS",
    "ZOOKEEPER_SETTINGS",
    "ConfigError",
    "ConfigProblem",
    "effective_queue_config",
    "load_config",
    "parse_config",
    "resolve_queue_configs",
]
