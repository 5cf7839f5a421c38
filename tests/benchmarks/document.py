"""BENCHMARKS.md: today's figures, one section per area, each block stamped with its run.

The file's layout::

    # Benchmarks
    (what the file is; a link to the history)
    ## Today's figures
    ### <area>                      one per AREAS, in that order (the README links to them)
    <!-- block: KEY -->             one per kind of measurement (BLOCKS)
    Run: `python -m tests.benchmarks --only ...` on <machine>; <date>, commit `...`.
    #### <table title>
    | ... |
    <!-- /block: KEY -->
    ## Notes

A run replaces the blocks it measured and keeps every other block as the file has it: blocks
no run writes (the integrity figures of ``python -m tests.benchmarks.integrity``, say) stay as
written, and so does any text under an area outside the blocks. Nothing here imports the
benchmarks: the report hands over Markdown.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TITLE = "# Benchmarks"
TODAY = "## Today's figures"
NOTES = "## Notes"
HISTORY = "docs/benchmarks-history.md"
PLOTS = "docs/img"  # relative to the report's directory

COMPACTION = "Compaction against DuckDB"
SCALE = "Scale"
SHAPES = "Shapes of data"
INCREMENTAL = "Incremental rounds"
SERVING = "Serving over REST and the wire"
STORAGE = "Object storage"
INSTANCES = "Several instances and a Spark cluster"
INTEGRITY = "Integrity"
PULSAR = "Beside Apache Pulsar"
TABLES = "Compacted topics as tables"
AREAS = (COMPACTION, SCALE, SHAPES, INCREMENTAL, SERVING, STORAGE, INSTANCES, INTEGRITY, PULSAR, TABLES)


@dataclass(frozen=True)
class Block:
    """One kind of measurement: where it goes and the sections of ``--only`` that measure it."""

    key: str
    area: str
    sections: tuple[str, ...]


BLOCKS = (
    Block("compaction", COMPACTION, ("compaction",)),
    Block("scale-points", COMPACTION, ("scale",)),
    Block("spark-profile", COMPACTION, ("compaction",)),
    Block("scale", SCALE, ("scale",)),
    Block("big", SCALE, ("big",)),
    Block("shapes", SHAPES, ("shapes",)),
    Block("incremental", INCREMENTAL, ("incremental",)),
    Block("layers", INCREMENTAL, ("layers",)),
    Block("big-layers", INCREMENTAL, ("big", "layers")),
    Block("rounds", INCREMENTAL, ("rounds",)),
    Block("partitions", INCREMENTAL, ("partitions",)),
    Block("serving", SERVING, ("serving",)),
    Block("wire", SERVING, ("wire",)),
    Block("tls", SERVING, ("tls",)),
    Block("shared", SERVING, ("shared",)),
    Block("scrape", SERVING, ("scrape",)),
    Block("soak", SERVING, ("soak",)),
    Block("storage", STORAGE, ("storage",)),
    Block("instances", INSTANCES, ("instances",)),
    Block("cluster", INSTANCES, ("cluster",)),
    Block("vs-pulsar", PULSAR, ("vs-pulsar",)),
    Block("tables", TABLES, ("tables",)),
    # Written by hand from ``python -m tests.benchmarks.integrity`` (an A/B of two commits): no run
    # of this suite replaces it.
    Block("integrity", INTEGRITY, ()),
)
BY_KEY = {b.key: b for b in BLOCKS}

INTRO = [
    "Today's figures, one section per area. Above each table is the run it comes from: the "
    "command that measures it, the machine, the date and the commit. `make bench` "
    "(`python -m tests.benchmarks`) measures every area but the Pulsar comparison and the scrape "
    "pairs, which run only when named (`--only vs-pulsar`, `--only scrape`), and the integrity "
    "A/B (`python -m tests.benchmarks.integrity`); a run replaces the figures of the sections it "
    "measured and keeps the rest. Runs differ in machine and load: compare figures within a table.",
    "",
    f"How these figures were reached, step by step: [the history]({HISTORY}).",
]

NOTES_LINES = [
    "- Units: seconds of wall clock; MB = 10^6 bytes; MiB = 2^20 bytes; msg/s = messages of the "
    "input (or produced, or consumed) per second. Medians of the runs shown unless a table says otherwise.",
    "- A compaction's time is the whole call, from reading the input to the last fsync of the output "
    "(every compactor fsyncs, as the service needs a durable compacted ledger); the inputs were just "
    "written, so they are in the page cache. Outputs are checked equal row for row every run.",
    "- Each size starts with one unmeasured warm-up round of every compactor (`--warmups`): on the JVM "
    "the first round at a new size is measurably slower. The 50M/5M round runs once, without one.",
    "- The project's compactor runs on a SparkSession warmed up as the service warms its own "
    "(one small compaction, then `compactor.warmup.warm_up_jit`'s empty jobs); DuckDB runs with its "
    "default threads (= cores); the Python compactor is single-threaded.",
    "- CPU s: user + system time of the benchmark process during the call (for the project also its "
    "children: the Spark JVM and Python workers); less disturbed than wall time by other work.",
    "- Peak memory: the project's is the peak RSS of the driver process plus that of its children, "
    "sampled every 50 ms; DuckDB's and Python's the growth of the benchmark process's RSS during "
    "the call; the maximum over the runs.",
    "- Load average: the benchmark alone loads about as many cores as the machine has; more means "
    "other work shared them, and wall-clock figures of such a run are not comparable with others.",
]

EMPTY = "No figures yet"  # an area without blocks says so, and how to measure it

_BEGIN = re.compile(r"^<!-- block: ([\w.-]+) -->$")
_END = re.compile(r"^<!-- /block: ([\w.-]+) -->$")

# An area's items: (block key, its text with markers) or (None, loose text), in file order.
Items = list[tuple[str | None, str]]


# --------------------------------------------------------------------------- the run's stamp


def commit() -> str:
    """The short commit of the checkout, "+ local changes" when its tree differs; "-" outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return f"`{head}`" + (" + local changes" if dirty else "")


def machine() -> str:
    import psutil

    from tests.benchmarks.report import cpu_model

    return (
        f"{os.cpu_count()} cores ({cpu_model()}), {psutil.virtual_memory().total / 2**30:.1f} GiB, "
        f"{platform.system()} {platform.release()}"
    )


def command_for(block: Block, argv: Sequence[str]) -> str:
    """The command that measures ``block`` alone with this run's options, and the run's own
    command when that was another (``--out`` and scratch directories left out)."""
    kept: list[str] = []
    only: set[str] = set()
    skip = {"--out", "--work-dir"}
    it = iter(argv)
    for a in it:
        name = a.split("=", 1)[0]
        if name in skip or name == "--keep-work-dir":
            if "=" not in a and name in skip:
                next(it, None)
            continue
        if name == "--only":
            value = a.split("=", 1)[1] if "=" in a else next(it, "")
            only = {s.strip() for s in value.split(",") if s.strip()}
            continue
        kept.append(a)
    alone = " ".join(["python -m tests.benchmarks", "--only", ",".join(block.sections), *kept])
    if only == set(block.sections):
        return f"`{alone}`"
    chosen = ["--only", ",".join(sorted(only))] if only else []
    run = " ".join(["python -m tests.benchmarks", *chosen, *kept])
    return f"`{alone}` (in a run of `{run}`)"


def stamp(command: str, *, where: str, when: str, commit: str, details: Sequence[str] = ()) -> str:
    """The line above a block's tables: ``Run: <command> on <where>; <when>, commit <commit>[; ...].``"""
    return "; ".join([f"Run: {command} on {where}; {when}, commit {commit}", *details]) + "."


# --------------------------------------------------------------------------- blocks


def block_text(key: str, run: str, items: Sequence[object]) -> str:
    """A block: its markers, the run's stamp, then each item (a table's ``markdown()``, or a
    line of Markdown such as a plot)."""
    out = [f"<!-- block: {key} -->", run, ""]
    for item in items:
        md = item if isinstance(item, str) else item.markdown()  # type: ignore[attr-defined]
        out += [md, ""]
    out.append(f"<!-- /block: {key} -->")
    return "\n".join(out)


def parse(text: str) -> dict[str, Items]:
    """The areas of a report in this layout, each as its items; {} for any other file."""
    lines = text.splitlines()
    try:
        start = lines.index(TODAY) + 1
    except ValueError:
        return {}
    areas: dict[str, Items] = {}
    area: str | None = None
    loose: list[str] = []
    block: tuple[str, list[str]] | None = None

    def flush_loose() -> None:
        kept = [line for line in loose if not line.startswith(EMPTY)]  # render's placeholder
        if area is not None and "\n".join(kept).strip():
            areas[area].append((None, "\n".join(kept).strip("\n")))
        loose.clear()

    for line in lines[start:]:
        if block is not None:
            block[1].append(line)
            end = _END.match(line)
            if end and end.group(1) == block[0]:
                areas[area].append((block[0], "\n".join(block[1])))  # type: ignore[index]
                block = None
            continue
        if line.startswith("## "):
            break
        if line.startswith("### "):
            flush_loose()
            area = line[4:].strip()
            areas.setdefault(area, [])
            continue
        begin = _BEGIN.match(line)
        if begin and area is not None:
            flush_loose()
            block = (begin.group(1), [line])
            continue
        loose.append(line)
    if block is not None:  # an unclosed block: kept as loose text, not lost
        loose += block[1]
    flush_loose()
    return areas


def merge(existing: Mapping[str, Items], measured: Mapping[str, str]) -> dict[str, Items]:
    """``existing`` with every block of ``measured`` (key -> block text) in place of the old one,
    or at the end of its area when the file had none."""
    areas: dict[str, Items] = {a: list(existing.get(a, [])) for a in AREAS}
    for a, items in existing.items():  # an area this code no longer names: kept, after the others
        areas.setdefault(a, list(items))
    for key, text in measured.items():
        items = areas[BY_KEY[key].area]
        at = next((i for i, (k, _) in enumerate(items) if k == key), None)
        if at is None:
            items.append((key, text))
        else:
            items[at] = (key, text)
    return areas


def render(areas: Mapping[str, Items]) -> str:
    out = [TITLE, "", *INTRO, "", TODAY, ""]
    for area, items in areas.items():
        out += [f"### {area}", ""]
        if not items:
            sections = sorted({s for b in BLOCKS if b.area == area for s in b.sections})
            out += [
                f"{EMPTY}: `python -m tests.benchmarks --only {','.join(sections)}`."
                if sections
                else f"{EMPTY}.",
                "",
            ]
        for _, text in items:
            out += [text, ""]
    out += [NOTES, "", *NOTES_LINES]
    return "\n".join(out).rstrip() + "\n"


def update(text: str | None, measured: Mapping[str, str]) -> str:
    """The report ``text`` (None: no file yet) with the blocks of ``measured`` replaced."""
    return render(merge(parse(text or ""), measured))


def write(path: Path, measured: Mapping[str, str]) -> None:
    """Replace the blocks of ``measured`` in the report at ``path`` (made when missing)."""
    old = path.read_text(encoding="utf-8") if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(update(old, measured), encoding="utf-8")
    os.replace(tmp, path)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")


def report_run(
    path: Path,
    found: Mapping[str, Sequence[object]],
    *,
    argv: Sequence[str],
    when: str,
    details: Sequence[str] = (),
    where: str | None = None,
    revision: str | None = None,
) -> None:
    """Write what a run found (block key -> its tables and Markdown lines) into the report at
    ``path``, each block stamped with the command that measures it, the machine, ``when`` and the
    commit; every block the run did not measure stays as it was."""
    where = machine() if where is None else where
    revision = commit() if revision is None else revision
    blocks = {}
    for key, items in found.items():
        run = stamp(command_for(BY_KEY[key], argv), where=where, when=when, commit=revision, details=details)
        blocks[key] = block_text(key, run, items)
    write(path, blocks)
