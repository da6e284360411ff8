"""Load tests for kestrel-actors: Kestrel's ``src/scripts/load`` tools re-done with gevent.

``python -m kestrel_actors.loadtests <scenario>`` (or ``kestrel-actors load <scenario>``) runs one scenario
against a running server; ``python -m kestrel_actors.loadtests.bench`` (``make bench``) starts a server and
runs the standard benchmark set into docs/benchmarks.md.

Modules: ``client`` (the one memcache client), ``items`` (payloads), ``figures`` (latency
histogram, throughput timeline), ``runner`` (greenlets and worker processes), ``admin``
(flush, stats, -M), ``output`` (report lines, progress bar), ``report`` (verdict, JSON line,
exit code), ``plot``, ``command`` and ``cli`` (click), and one module per scenario in
``scenarios``; ``dialect`` picks a scenario's requests and reply readers, memcache or (``--resp``)
Redis's RESP (``resp``). ``actor_hop_bench`` and ``spark_bridge_bench`` are separate micro-benchmarks;
``kill_soak`` SIGKILLs and SIGTERMs a server it starts, under mixed load, and checks that no
acknowledged item is lost and no confirmed one delivered again (docs/durability.md).
"""

__all__: list[str] = []
