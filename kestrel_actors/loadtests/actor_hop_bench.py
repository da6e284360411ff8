"""Cost of one pykka ask round trip on the threading runtime and on our gevent runtime.

``python -m kestrel_actors.loadtests.actor_hop_bench``: the figures behind docs/adr/0001-actor-runtime.md.
"""

from __future__ import annotations

import threading
import time

import gevent
import pykka

from kestrel_actors.runtime import GeventActor

N = 20_000


class ThreadEcho(pykka.ThreadingActor):
    def on_receive(self, message):
        return message


class GeventEcho(GeventActor):
    def on_receive(self, message):
        return message


def per_ask_us(ref, callers: int, spawn) -> float:
    def run():
        for i in range(N // callers):
            ref.ask(i)

    start = time.perf_counter()
    spawn(run, callers)
    return (time.perf_counter() - start) / N * 1e6


def threads(fn, count):
    workers = [threading.Thread(target=fn) for _ in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def greenlets(fn, count):
    gevent.joinall([gevent.spawn(fn) for _ in range(count)])


def main() -> None:
    for callers in (1, 50):
        t = ThreadEcho.start()
        g = GeventEcho.start()
        print(
            f"{callers:3d} callers: threading {per_ask_us(t, callers, threads):5.1f} us/ask, "
            f"gevent {per_ask_us(g, callers, greenlets):5.1f} us/ask"
        )
        t.stop()
        g.stop()


if __name__ == "__main__":
    main()
