"""kestrel-actors: a durable message-queue server that speaks Kestrel's protocols.

Subpackages: ``protocol`` (sans-I/O codecs), ``actors`` (the gevent pykka runtime and the
queue, connection and collection actors), ``journal`` (Kestrel's on-disk format),
``client`` (the Python client), ``spark_bridge`` (queues into Spark jobs) and ``cli``.
"""

__version__ = "0.1.0"
KESTREL_VERSION = "2.4.7"
"""The Kestrel release whose protocol this server implements. ``version`` (memcache and text)
and STATS ``version`` report it: libmemcached's tools refuse a major version of 0 and node's
memcached client wants ``x.y.z``; ``kestrel-actors --version`` prints ``__version__``."""
