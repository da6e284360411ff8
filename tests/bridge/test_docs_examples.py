"""docs/spark-bridge.md's data-source examples run as written (issue 22): the loading
example, the word count (``availableNow``), the sink and the progress snippet, in one fresh
Python process that is told nothing about Spark (no ``PYSPARK_PYTHON``): only the server's
address and the /tmp paths are replaced by this test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ._spark_jobs import REPO, drain, queue_stats

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

DOC = REPO / "docs" / "spark-bridge.md"


def python_blocks(text: str, first: str, last: str) -> list[str]:
    """The ```python blocks between the headings ``first`` and ``last``."""
    section = text[text.index(first):text.index(last)]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def test_the_data_source_examples_run_as_written(server, tmp_path):
    blocks = python_blocks(DOC.read_text(), "## Loading data into a queue", "## The bridge")
    assert len(blocks) == 4, "loading, word count, sink, progress"
    script = "\n".join(blocks)
    script = script.replace("127.0.0.1:22133", f"127.0.0.1:{server.port}")
    script = script.replace('"/tmp/', f'"{tmp_path}/')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = str(REPO)  # what `make install` gives: kestrel_actors importable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)  # 575 s at load 11-15
    assert done.returncode == 0, done.stderr[-4000:]
    # the word count's console output: "the" is in two of the three lines, three times
    assert re.search(r"\|\s*the\s*\|\s*3\s*\|", done.stdout), done.stdout[-3000:]
    assert queue_stats(server, "lines") == (0, 0)
    assert sorted(drain(server, "shouted")) == [b"HELLO", b"WORLD"]
    assert queue_stats(server, "out") == (0, 0)
