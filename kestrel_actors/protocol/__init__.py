"""Wire protocols, sans I/O: codecs turn bytes into commands and replies into bytes.

Nothing here touches a socket or a queue; a session actor feeds a decoder and writes what the
encoders return. ``_memcache`` is Kestrel's memcache protocol, ``_text`` its text protocol,
``_thrift`` its thrift protocol (framed, binary; the IDL ``kestrel.thrift`` ships beside it).
"""

from ._commands import *  # noqa: F403
from ._commands import __all__ as _commands_all
from ._memcache import *  # noqa: F403
from ._memcache import __all__ as _memcache_all
from ._text import *  # noqa: F403
from ._text import __all__ as _text_all
from ._text_commands import *  # noqa: F403
from ._text_commands import __all__ as _text_commands_all
from ._thrift import *  # noqa: F403
from ._thrift import __all__ as _thrift_all

# each room's own __all__ (lists of names; ruff cannot see through the star re-exports)
__all__ = [*_commands_all, *_memcache_all, *_text_all, *_text_commands_all, *_thrift_all]  # noqa: PLE0604
