"""Wire protocols, sans I/O: codecs turn bytes into commands and replies into bytes.

Nothing here touches a socket or a queue; a session actor feeds a decoder and writes what the
encoders return. ``_memcache`` is Kestrel's memcache protocol, ``_text`` its text protocol,
and :mod:`.thrift` its thrift protocol (framed, binary; the IDL ``kestrel.thrift`` ships beside
it): a face of its own, since importing it loads the IDL.
"""

import importlib

from ._commands import *  # noqa: F403
from ._commands import __all__ as _commands_all
from ._decoder import Decoder
from ._memcache import *  # noqa: F403
from ._memcache import __all__ as _memcache_all
from ._replies import compose_dump_config, compose_dump_stats, config_settings
from ._text import *  # noqa: F403
from ._text import __all__ as _text_all
from ._text_commands import *  # noqa: F403
from ._text_commands import __all__ as _text_commands_all

# The thrift codec loads Kestrel's IDL when it is imported (~0.1 s, most of this package's
# import): its names (``thrift.__all__``) are imported on first use, so a process that never
# speaks thrift (the Python client, a Spark worker reading a queue through it) is spared that.


def __getattr__(name: str) -> object:
    if not name.startswith("_"):  # private and dunder lookups (the import system's) never load it
        thrift = importlib.import_module(f"{__name__}.thrift")
        if name in thrift.__all__:
            return getattr(thrift, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# each room's own __all__ (lists of names; ruff cannot see through the star re-exports); the
# thrift names are reached through __getattr__ above
__all__ = [  # noqa: PLE0604
    "Decoder", "compose_dump_config", "compose_dump_stats", "config_settings",
    *_commands_all, *_memcache_all, *_text_all, *_text_commands_all,
]
