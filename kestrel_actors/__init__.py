"""kestrel-actors: a durable message-queue server that speaks Kestrel's protocols.

Subpackages: ``protocol`` (sans-I/O codecs), ``queue`` (a queue's logic, no actors or I/O),
``journal`` (Kestrel's on-disk format), ``runtime`` (the gevent runtime for pykka),
``messages`` (the records rooms exchange), ``stats`` (server-wide counters), ``actors`` (the
queue and collection actors), ``session`` (one client connection), ``admin`` (the HTTP port),
``client`` (the Python clients), ``spark_bridge`` (queues into Spark), ``cli`` and
``loadtests`` (the load tests and benches, ``python -m kestrel_actors.loadtests``).

A comment's ``behaviour §N`` cites section N of ``docs/behaviour.md``, the project's own
reference for what the server does and where it differs from Kestrel.
"""

from ._compiled import install_guard as _install_guard

_install_guard()  # before any compiled module is imported: a stale build must not be (ADR 0015)

__version__ = "0.1.0"
KESTREL_VERSION = "2.4.7"
"""The Kestrel release whose protocol this server implements. ``version`` (memcache and text)
and STATS ``version`` report it: libmemcached's tools refuse a major version of 0 and node's
memcached client wants ``x.y.z``; ``kestrel-actors --version`` prints ``__version__``."""
