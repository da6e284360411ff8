"""``--plot FILE.png``: throughput over time and the latency distribution of a run.

matplotlib is an optional extra (``.[load]``), so it is imported only here, only when a plot
is asked for, with the non-interactive Agg backend.
"""

from __future__ import annotations

from .figures import BUCKET_NS, Figures, bucket_value

__all__ = ["plot_figures"]


def plot_figures(series: dict[str, Figures], path: str, title: str = "") -> None:
    """Write a two-panel PNG: items/s per 100 ms bucket, and latency percentiles (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    per_second = 1e9 / BUCKET_NS
    starts = [f.go_ns for f in series.values() if f.go_ns]
    base = min(starts) if starts else 0
    for name, figures in series.items():
        if not figures.timeline or not figures.go_ns:
            continue
        # one time axis for all series (they share the scenario's epoch); skip set-up time
        first = max(0, (figures.go_ns - figures.epoch) // BUCKET_NS)
        xs = [(figures.epoch + i * BUCKET_NS - base) / 1e9
              for i in range(first, len(figures.timeline))]
        ys = [count * per_second for count in figures.timeline[first:]]
        top.plot(xs, ys, label=f"{name} ({figures.rate:,.0f}/s overall)", linewidth=1)
    top.set_xlabel("seconds since the first run started")
    top.set_ylabel("items/s (100 ms buckets)")
    top.set_title(f"{title}: throughput")
    top.grid(True, alpha=0.3)
    top.legend(loc="best")

    for name, figures in series.items():
        total = figures.samples
        if not total:
            continue
        xs, ys, seen = [], [], 0
        for index in sorted(figures.hist):
            seen += figures.hist[index]
            xs.append(max(bucket_value(index), 1))
            ys.append(100.0 * seen / total)
        lat = figures.latency()
        bottom.plot(xs, ys, label=f"{name} p50={lat['p50']} p99={lat['p99']} usec", linewidth=1)
    bottom.set_xscale("log")
    bottom.set_xlabel("latency (usec)")
    bottom.set_ylabel("% of requests at or below")
    bottom.set_title("latency distribution (CDF)")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
