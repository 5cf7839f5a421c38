"""The report's plots, drawn from figures alone (no benchmark types): a run calls them with its
results (``tests.benchmarks.report``), and the same functions drew today's plots from the figures
in BENCHMARKS.md's tables. Each writes a PNG and returns its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def scale(points: Mapping[str, Sequence[tuple[int, float]]], path: Path, *, cores: int | None) -> Path:
    """Median seconds of a full compaction against messages, one line per compactor (log-log).
    ``points``: compactor -> [(messages, seconds)]."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for (name, xy), marker in zip(points.items(), "os^dv", strict=False):
        xy = sorted(xy)
        if xy:
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker=marker, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages (keys = messages / 10, 100-byte values)")
    ax.set_ylabel("median wall time of a full compaction (s)")
    ax.set_title("Full compaction time against size" + (f" ({cores} cores)" if cores else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def shapes(rows: Sequence[tuple[str, float, float, float]], path: Path) -> Path:
    """A full round by shape of data: the project's and DuckDB's median seconds side by side.
    ``rows``: (shape, project s, DuckDB s, project / DuckDB as the table has it)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ys = list(range(len(rows)))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], [r[1] for r in rows], height=h, label="project (Spark)")
    ax.barh([y + h / 2 for y in ys], [r[2] for r in rows], height=h, label="DuckDB")
    for y, (_, p, d, ratio) in zip(ys, rows, strict=True):
        ax.annotate(f"{ratio:.2f}x", (max(p, d), y), xytext=(4, 0), textcoords="offset points", va="center")
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median wall time of a full round (s, log); label: project / DuckDB")
    ax.set_title("A full round by shape of data")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)


def dirty_share(
    shares: Sequence[float],
    delta_s: Sequence[float],
    consolidate_s: Sequence[float],
    full_s: float,
    label: str,
    path: Path,
) -> Path:
    """Round time against the share of new messages (%): delta rounds, consolidating rounds, and
    the full round as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(shares, delta_s, marker="o", label="delta round (layers)")
    ax.plot(shares, consolidate_s, marker="s", label="consolidating round (copy)")
    ax.axhline(full_s, color="grey", linestyle="--", label="full round")
    ax.set_xscale("log")
    ax.set_xlabel(f"new messages, % of the topic ({label})")
    ax.set_ylabel("median wall time of the round (s)")
    ax.set_title("Round time against dirty share")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)
