"""Terminal output: Kestrel's report lines on stdout and the optional tqdm progress bar.

The bar (stderr, only on a terminal unless ``--progress``) shows the run's progress count,
``Shared.total()``, polled every 0.2 s; ``say`` prints report lines above it so the two do
not garble each other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Bar", "say"]

_active: Any = None  # the tqdm bar on screen, if any


def say(text: str) -> None:
    """Print one of Kestrel's report lines on stdout (above the progress bar if one is shown)."""
    if _active is not None:
        _active.write(text, file=sys.stdout)
    else:
        print(text, flush=True)


class Bar:
    """A progress bar over ``total()`` (a no-op when ``enabled`` is false)."""

    def __init__(self, enabled: bool, target: int, label: str, total: Callable[[], int]) -> None:
        global _active
        self._total = total
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = _active = tqdm(total=target, desc=label, unit="item", file=sys.stderr,
                                       leave=False, dynamic_ncols=True, mininterval=0.2)

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(self._total() - self._bar.n)

    def poll(self) -> None:
        """Greenlet body: update every 0.2 s until killed."""
        import gevent

        while self._bar is not None:
            self.update()
            gevent.sleep(0.2)

    def close(self) -> None:
        global _active
        if self._bar is not None:
            self.update()
            self._bar.close()
            self._bar = _active = None
