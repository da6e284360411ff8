"""The training load of the profile-guided build: every ``make bench`` row, small, on real servers.

    python -m kestrel_actors.loadtests.training [--scale 1.0]

``setup.py`` runs this between its instrumented and its final compile (``KESTREL_ACTORS_PGO=1``,
ADR 0015): gcc then lays out and optimises the compiled request path for what these runs did.
Each row gets a fresh ``serve`` with the row's own server flags, stopped with SIGTERM so that it
exits normally (an instrumented extension writes its counts at exit). The load generator's own
counts go to a scratch directory (``GCOV_PREFIX``): it imports compiled modules too, and the
profile is the server's. Exits non-zero when a server or a run fails, so the build falls back to
its plain compile.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from .bench import BENCHMARKS, Server

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies each row's --quick item count (default 1.0)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kestrel-training-") as scratch:
        client_env = dict(os.environ, GCOV_PREFIX=scratch)
        for bench in BENCHMARKS:
            command = bench.load_args(quick=True, scale=args.scale)
            server = Server(bench.serve_args)
            try:
                # -X faulthandler: a generator killed by a signal prints its Python stacks
                run = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "kestrel_actors.loadtests", *command,
                                      "-p", str(server.port), "--no-progress", "--timeout", "300"],
                                     env=client_env, capture_output=True, text=True, timeout=600, check=False)
            finally:
                code = server.stop()
            if run.returncode != 0:
                died = f", {signal.Signals(-run.returncode).name}" if run.returncode < 0 else ""
                print(f"training: {' '.join(command)} failed ({run.returncode}{died}): {run.stderr[-1500:]}",
                      file=sys.stderr)
                return 1
            if code != 0:
                print(f"training: the server of {' '.join(command)} exited with {code}", file=sys.stderr)
                return 1
    print(f"training: {len(BENCHMARKS)} rows in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
