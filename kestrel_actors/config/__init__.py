"""A server's configuration: the settings, and the TOML file they are loaded from (docs/configuration.md).

``_settings`` holds the typed records (:class:`ServerConfig`, :class:`QueueConfig`, with Kestrel's
defaults), ``_file`` reads a file into them, every problem with its file, line and key
(``_toml_lines`` finds the line), and ``_values`` parses one value each (a duration, a size, a
token): the command line's flags use the same parsers, so a flag and a key take the same words.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_face

if TYPE_CHECKING:
    from ._file import (
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
    from ._settings import INT_MAX, LONG_MAX, QueueConfig, ServerConfig, ZooKeeperConfig, ZooKeeperCredentials
    from ._values import BadValue, duration, positive_size, sync_journal, token, zookeeper_path

# Each name's private module, imported on first use: a Spark source's short-lived processes
# parse a few durations and need neither the settings' records nor the file reader (ADR 0022).
_HOMES = {
    **dict.fromkeys(("QUEUE_SETTINGS", "SERVER_SETTINGS", "ZOOKEEPER_SETTINGS", "ConfigError", "ConfigProblem",
                     "effective_queue_config", "load_config", "parse_config", "resolve_queue_configs"), "._file"),
    **dict.fromkeys(("INT_MAX", "LONG_MAX", "QueueConfig", "ServerConfig", "ZooKeeperConfig",
                     "ZooKeeperCredentials"), "._settings"),
    **dict.fromkeys(("BadValue", "duration", "positive_size", "sync_journal", "token", "zookeeper_path"), "._values"),
}

__all__ = [
    "INT_MAX",
    "LONG_MAX",
    "QUEUE_SETTINGS",
    "SERVER_SETTINGS",
    "ZOOKEEPER_SETTINGS",
    "BadValue",
    "ConfigError",
    "ConfigProblem",
    "QueueConfig",
    "ServerConfig",
    "ZooKeeperConfig",
    "ZooKeeperCredentials",
    "duration",
    "effective_queue_config",
    "load_config",
    "parse_config",
    "positive_size",
    "resolve_queue_configs",
    "sync_journal",
    "token",
    "zookeeper_path",
]


__getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, __all__)
