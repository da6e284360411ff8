"""Wire protocols, sans I/O: codecs turn bytes into commands and replies into bytes.

Nothing here touches a socket or a queue; the connection actor feeds the decoder and writes
what the encoders return.
"""

from ._commands import *  # noqa: F403
from ._commands import __all__ as _commands_all
from ._memcache import *  # noqa: F403
from ._memcache import __all__ as _memcache_all

__all__ = [*_commands_all, *_memcache_all]
