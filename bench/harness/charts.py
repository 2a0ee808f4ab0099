"""Charts of a run's results (matplotlib, Agg: no display needed), written as PNG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def draw_chart(
    rows: dict[str, Any],
    path: Path,
    title: str,
    workloads: Sequence[str],
    colors: Mapping[str, str],
) -> None:
    """One panel per workload (in `workloads`' order): each row's median rate (latency: p50 and
    p99), colored by its system (`colors`), horizontal bars so the long labels stay readable.
    A row is a dict with `workload`, `system`, `label` and `median_per_s` (or, for latency,
    `median_p50_ms` and `median_p99_ms`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = [w for w in workloads if any(r["workload"] == w for r in rows.values())]
    heights = [max(1, sum(r["workload"] == w for r in rows.values())) + 1.2 for w in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(10, 0.45 * sum(heights) + 1.2),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, workload in zip(axes[:, 0], panels, strict=True):
        mine = [r for r in rows.values() if r["workload"] == workload]
        labels = [r["label"] for r in mine]
        shades = [colors[r["system"]] for r in mine]
        ys = list(range(len(mine)))[::-1]
        if workload == "latency":
            p50 = [r["median_p50_ms"] for r in mine]
            p99 = [r["median_p99_ms"] for r in mine]
            ax.barh([y + 0.2 for y in ys], p50, height=0.4, color=shades, alpha=0.55)
            ax.barh([y - 0.2 for y in ys], p99, height=0.4, color=shades)
            for y, a, b in zip(ys, p50, p99, strict=True):
                ax.text(a, y + 0.2, f" p50 {a:.2f} ms", va="center", fontsize=8)
                ax.text(b, y - 0.2, f" p99 {b:.2f} ms", va="center", fontsize=8)
            ax.set_xlabel("end-to-end latency, ms (lower is better)")
        else:
            rates = [r["median_per_s"] for r in mine]
            ax.barh(ys, rates, color=shades)
            for y, v in zip(ys, rates, strict=True):
                ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
            ax.set_xlabel("messages per second (higher is better)")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=9)
        ax.set_title(workload, loc="left", fontsize=10, fontweight="bold")
        ax.margins(x=0.25)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
