"""The end of every scenario: verdict, the final JSON line, the optional plot, the exit code.

Every scenario prints Kestrel's own report lines as it goes and then hands an ``Outcome`` to
``finish``, which prints a two-line summary (ops/s; average, p50, p95, p99 and max latency in
ms, as redis-benchmark and memtier report), then exactly one JSON line (the figures a script or
``kestrel_actors.loadtests.bench`` parses; the last line of stdout), writes ``--json-out`` and
``--csv`` files, and returns the process exit code:

* 0 — the run completed and nothing was wrong;
* 1 — a correctness failure: an unexpected reply, wrong bytes, an order violation, or items
  lost or delivered twice;
* 3 — the harness could not complete the run (no connection, timeout); no verdict.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from .figures import Figures

__all__ = ["EXIT_FAILED", "EXIT_HARNESS", "EXIT_OK", "SUMMARY_FIELDS", "Outcome", "Reports", "finish",
           "summary_row", "tally"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_HARNESS = 3


def tally(seen: bytes | None, first: int = 0, end: int | None = None) -> tuple[list[int], int]:
    """Ids in ``[first, end)`` never received, and the number of extra (duplicate) receipts."""
    if seen is None:
        return [], 0
    window = seen[first:end]
    missing = [first + i for i, count in enumerate(window) if count == 0] if 0 in window else []
    duplicated = sum(window) - (len(window) - len(missing))
    return missing, duplicated


@dataclass
class Outcome:
    """What a scenario found; ``main`` holds the headline figures."""

    scenario: str
    main: Figures
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    wall_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Figures] = field(default_factory=dict)  # what --plot draws

    def absorb(self, result: Any, headline: bool = True) -> None:
        """Take over the failures, errors and (for a headline run) client CPU of a ``RunResult``.

        ``client_cpu_seconds`` (summed over headline runs and processes) shows whether the
        client could have been the bottleneck: near ``wall_seconds`` x processes means busy.
        """
        self.failures.extend(result.failures)
        self.errors.extend(result.errors)
        if not headline:
            return
        cpu = self.extra.get("client_cpu_seconds", 0.0) + result.client_cpu
        self.extra["client_cpu_seconds"] = round(cpu, 3)

    @property
    def exit_code(self) -> int:
        if self.failures or self.lost or self.duplicated:
            return EXIT_FAILED
        if self.errors:
            return EXIT_HARNESS
        return EXIT_OK

    def as_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"scenario": self.scenario, "ok": self.exit_code == EXIT_OK}
        record.update(self.main.summary())
        record.update(lost=self.lost, duplicated=self.duplicated,
                      wall_seconds=round(self.wall_seconds, 4))
        record.update(self.extra)
        if self.failures:
            record["failures"] = _grouped(self.failures)
        if self.errors:
            record["errors"] = _grouped(self.errors)
        return record


def _grouped(messages: list[str], limit: int = 20) -> list[str]:
    """Identical messages once each, with a count (100 clients often fail the same way)."""
    counts: dict[str, int] = {}
    for message in messages:
        counts[message] = counts.get(message, 0) + 1
    grouped = [m if n == 1 else f"{m} (x{n})" for m, n in counts.items()]
    return grouped[:limit] + ([f"... and {len(grouped) - limit} more"] if len(grouped) > limit else [])


@dataclass(frozen=True)
class Reports:
    """Where a run's verdict and figures go besides stdout: ``where`` names the command in error
    lines (``kestrel-actors load put-many: …``), and the optional files."""

    where: str = "kestrel-actors load"
    plot: str | None = None
    json_out: str | None = None
    csv: str | None = None


SUMMARY_FIELDS = ("scenario", "ok", "items", "seconds", "ops_per_sec", "avg_ms", "p50_ms", "p95_ms",
                  "p99_ms", "max_ms", "lost", "duplicated")
"""The columns of ``--csv``, in order (the summary as redis-benchmark's and memtier's give it)."""


def summary_row(outcome: Outcome) -> dict[str, Any]:
    """The headline figures in the units people compare load tools in: ops/s and milliseconds."""
    figures = outcome.main

    def ms(usec: float) -> float:
        return round(usec / 1000, 3)

    return {
        "scenario": outcome.scenario, "ok": outcome.exit_code == EXIT_OK, "items": figures.items,
        "seconds": round(figures.seconds, 3), "ops_per_sec": round(figures.rate, 1),
        "avg_ms": ms(figures.mean_usec()), "p50_ms": ms(figures.percentile(0.50)),
        "p95_ms": ms(figures.percentile(0.95)), "p99_ms": ms(figures.percentile(0.99)),
        "max_ms": ms(figures.max_usec()), "lost": outcome.lost, "duplicated": outcome.duplicated,
    }


def summary_lines(row: dict[str, Any]) -> list[str]:
    return [
        f"Summary: {row['items']:,} items in {row['seconds']:.3f} s, {row['ops_per_sec']:,.1f} ops/s",
        (f"Latency (ms): avg {row['avg_ms']:.3f}  p50 {row['p50_ms']:.3f}  p95 {row['p95_ms']:.3f}  "
         f"p99 {row['p99_ms']:.3f}  max {row['max_ms']:.3f}"),
    ]


def finish(outcome: Outcome, reports: Reports = Reports()) -> int:
    """Report problems on stderr, print the summary and the JSON line, write the plot and the
    files asked for; return the exit code."""
    if outcome.lost:
        outcome.failures.append(f"{outcome.lost} items lost")
    if outcome.duplicated:
        outcome.failures.append(f"{outcome.duplicated} items delivered more than once")
    for failure in _grouped(outcome.failures):
        print(f"{reports.where}: failed: {failure}", file=sys.stderr)
    for error in _grouped(outcome.errors):
        print(f"{reports.where}: {error}", file=sys.stderr)
    if reports.plot:
        from .plot import plot_figures

        try:
            plot_figures(outcome.series or {outcome.main.name: outcome.main}, reports.plot,
                         title=outcome.scenario)
        except Exception as exc:  # noqa: BLE001 - a plot problem must not hide the verdict
            print(f"{reports.where}: cannot draw {reports.plot}: {exc}", file=sys.stderr)
    row = summary_row(outcome)
    for line in summary_lines(row):
        print(line)
    record = json.dumps(outcome.as_json(), sort_keys=False)
    print(record, flush=True)
    try:
        if reports.json_out:
            with open(reports.json_out, "w") as file:
                file.write(record + "\n")
        if reports.csv:
            with open(reports.csv, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=SUMMARY_FIELDS)
                writer.writeheader()
                writer.writerow(row)
    except OSError as exc:
        print(f"{reports.where}: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_HARNESS
    return outcome.exit_code
