"""One client's session: the protocol-neutral session actor and the protocol handlers."""

from ._actor import Disconnected, Received, SessionActor
from ._memcache import ConnectionActor
from ._text import TextConnectionActor

__all__ = ["ConnectionActor", "Disconnected", "Received", "SessionActor", "TextConnectionActor"]
