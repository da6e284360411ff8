"""What the server does to its own process when it starts serving."""

from __future__ import annotations

import subprocess
import sys

from ..helpers import REPO


def test_serving_tunes_the_cyclic_gc_and_freezes_what_start_up_made():
    """Run in a child process: the collector's settings are the whole process's."""
    code = (
        "import gc\n"
        "from kestrel_actors.server import GC_THRESHOLDS, _tune_gc\n"
        "assert gc.get_threshold() != GC_THRESHOLDS\n"
        "_tune_gc()\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
