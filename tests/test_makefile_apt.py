"""The Makefile's Debian installs wait for another apt-get instead of failing on its lock.

A fresh machine's first `make test` installs several Debian packages; anything else running
apt-get meanwhile (an unattended upgrade, a second make) holds apt's lock, and `apt-get update`
fails at once with "Could not get lock", which stopped `make test` before a test ran. The recipe
the targets share (`APT_INSTALL`) is run here with a stand-in `apt-get` on PATH that reports the
lock held on its first `update`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE_APT_GET = """#!/bin/sh
echo "$@" >> "$APT_CALLS"
case "$*" in
  *update*)
    if [ ! -e "$APT_CALLS.held-once" ]; then
      touch "$APT_CALLS.held-once"
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
      exit 100
    fi
    [ -n "$APT_UPDATE_BROKEN" ] && { echo "E: The repository is broken" >&2; exit 100; }
    ;;
esac
exit 0
"""


def _run_apt_install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(FAKE_APT_GET)
    fake.chmod(0o755)
    # Not root here, the recipe would call sudo: a stand-in that runs its arguments.
    sudo = bin_dir / "sudo"
    sudo.write_text('#!/bin/sh\nexec "$@"\n')
    sudo.chmod(0o755)
    calls = tmp_path / "calls"
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", str(ROOT / "Makefile"),
         "--eval", "apt-probe: ; @$(APT_INSTALL) probe-package", "apt-probe", "APT_RETRY_SECONDS=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APT_CALLS": str(calls), **env},
    )
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_update_waits_for_a_held_lock_then_installs(tmp_path: Path) -> None:
    result, calls = _run_apt_install(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "another apt-get holds apt's lock" in result.stdout
    updates = [call for call in calls if "update" in call.split()]
    installs = [call for call in calls if "install" in call.split()]
    assert len(updates) == 2
    assert len(installs) == 1 and "probe-package" in installs[0]
    # install waits on dpkg's lock itself
    assert "DPkg::Lock::Timeout=600" in installs[0]


def test_any_other_update_failure_stops_with_its_message(tmp_path: Path) -> None:
    result, calls = _run_apt_install(tmp_path, APT_UPDATE_BROKEN="1")
    assert result.returncode != 0
    assert "The repository is broken" in result.stderr
    assert not [call for call in calls if "install" in call.split()]
