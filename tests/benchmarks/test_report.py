"""BENCHMARKS.md and the code that writes it (``tests.benchmarks.document``): the file is short,
opens with today's figures and names the command of every table; a run of one area replaces that
area's block and nothing else; the plots are written from figures alone. No benchmark runs here:
the results are built in the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks import document
from tests.benchmarks.report import Table, vs_pulsar_tables
from tests.benchmarks.vs_pulsar import BrokerRuns, Run, VsPulsarParams, VsPulsarResult

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "BENCHMARKS.md"


def tables_and_commands(text: str) -> list[tuple[int, str | None]]:
    """Each table's first line number and the command of the last ``Run:`` line before it in its
    area and block (None when there is none)."""
    found: list[tuple[int, str | None]] = []
    command: str | None = None
    previous = ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith(("## ", "### ")) or line.startswith("<!-- block:"):
            command = None
        elif line.startswith("Run: `python -m tests.benchmarks"):
            command = line.split("`")[1]
        elif line.startswith("|") and not previous.startswith("|"):
            found.append((n, command))
        previous = line
    return found


def vs_pulsar_result(rate: float) -> VsPulsarResult:
    """One durable run of each broker, produced at ``rate`` msg/s (Pulsar) and half that (service)."""

    def side(name: str, scale: float) -> BrokerRuns:
        runs = BrokerRuns(name, ready_s=3.0)
        for what in ("produce-1", "produce-4", "consume"):
            run = Run(what, messages=int(rate * scale), rate=rate * scale, window_s=1.0, max_ms=0.0)
            run.broker_cpu_s, run.wall_s, run.load = 1.0, 1.0, (1.0, 1.0, 1.0)
            runs.runs[what] = run
        return runs

    result = VsPulsarResult(VsPulsarParams(seconds=1, modes=("durable",), latency_rates=()), "4.0.7")
    result.modes["durable"] = {"Pulsar": side("Pulsar", 1.0), "service": side("service", 0.5)}
    return result


def test_benchmarks_md_is_short_and_opens_with_todays_figures() -> None:
    text = BENCHMARKS.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 500
    assert [line for line in lines if line.startswith("## ")][0] == document.TODAY
    # One section per area, under the headings the README links to, in this order.
    areas = [line[4:] for line in lines if line.startswith("### ")]
    assert areas == list(document.AREAS)
    # The file is in the layout the report writes: a run that measured nothing leaves it as it is.
    assert document.update(text, {}) == text


def test_every_table_of_benchmarks_md_is_preceded_by_its_command() -> None:
    found = tables_and_commands(BENCHMARKS.read_text(encoding="utf-8"))
    assert len(found) >= len(document.AREAS)
    assert [n for n, command in found if command is None] == []


def test_the_plots_benchmarks_md_links_exist() -> None:
    text = BENCHMARKS.read_text(encoding="utf-8")
    plots = [part.split(")")[0] for part in text.split("](")[1:] if ".png" in part.split(")")[0]]
    assert plots
    for plot in plots:
        assert (ROOT / plot).is_file(), plot


def test_a_run_of_one_area_replaces_that_area_only(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    before = BENCHMARKS.read_text(encoding="utf-8")  # every area's figures
    out.write_text(before, encoding="utf-8")
    found = {"vs-pulsar": list(vs_pulsar_tables(vs_pulsar_result(123_456.0)))}
    document.report_run(
        out,
        found,
        argv=["--only", "vs-pulsar", "--out", str(out)],
        when="2026-11-29 10:00 UTC",
        revision="`abc1234`",
    )
    after = out.read_text(encoding="utf-8")

    old, new = document.parse(before), document.parse(after)
    assert list(new) == list(old)
    for area in document.AREAS:
        if area != document.PULSAR:
            assert new[area] == old[area], area
    # Everything before the area and the notes after it: unchanged to the byte.
    head = f"### {document.PULSAR}\n"
    assert after.split(head)[0] == before.split(head)[0]
    assert after.split(document.NOTES)[1] == before.split(document.NOTES)[1]
    # The area holds the new figures, stamped with their command, and none of the old ones.
    ((key, block),) = new[document.PULSAR]
    assert key == "vs-pulsar"
    assert "123,456" in block and "61,728" in block
    assert "Run: `python -m tests.benchmarks --only vs-pulsar` on " in block
    assert "2026-11-29 10:00 UTC, commit `abc1234`" in block
    assert "646,507" in before and "646,507" not in after
    assert "--out" not in block
    assert all(command for _, command in tables_and_commands(after))


def test_a_run_into_a_new_file_writes_every_area(tmp_path: Path) -> None:
    out = tmp_path / "new" / "report.md"
    table = Table("Full compaction: 1M/100k", ["compactor", "median s"], [["project (Spark)", "0.29"]])
    document.report_run(
        out,
        {"compaction": [table], "scale": ["![time against size](docs/img/scale.png)"]},
        argv=["--quick", "--only", "compaction,scale", f"--out={out}"],
        when="2026-11-29 10:00 UTC",
        where="2 cores",
        revision="`abc1234`",
    )
    text = out.read_text(encoding="utf-8")
    assert [line[4:] for line in text.splitlines() if line.startswith("### ")] == list(document.AREAS)
    areas = document.parse(text)
    assert [k for k, _ in areas[document.COMPACTION]] == ["compaction"]
    assert [k for k, _ in areas[document.SCALE]] == ["scale"]
    assert (
        "Run: `python -m tests.benchmarks --only compaction --quick` "
        "(in a run of `python -m tests.benchmarks --only compaction,scale --quick`) on 2 cores" in text
    )
    assert "#### Full compaction: 1M/100k" in text and "| project (Spark) | 0.29 |" in text
    assert "No figures yet: `python -m tests.benchmarks --only vs-pulsar`." in text
    # A second run of another area keeps the first one's block.
    document.report_run(
        out, {"big": [table]}, argv=["--only", "big"], when="now", where="2 cores", revision="-"
    )
    again = document.parse(out.read_text(encoding="utf-8"))
    assert again[document.COMPACTION] == areas[document.COMPACTION]
    assert [k for k, _ in again[document.SCALE]] == ["scale", "big"]
    # An area's first block takes the place of its placeholder.
    document.report_run(out, {"vs-pulsar": [table]}, argv=[], when="now", where="2 cores", revision="-")
    text = out.read_text(encoding="utf-8")
    assert "No figures yet: `python -m tests.benchmarks --only vs-pulsar`" not in text
    assert [k for k, _ in document.parse(text)[document.PULSAR]] == ["vs-pulsar"]


def test_text_outside_blocks_and_unknown_blocks_are_kept() -> None:
    text = document.update(
        None, {"integrity": "<!-- block: integrity -->\nRun: `x`\n<!-- /block: integrity -->"}
    )
    text = text.replace("### Object storage\n", "### Object storage\n\nA note by hand.\n")
    text = text.replace(
        "### Scale\n", "### Scale\n\n<!-- block: by-hand -->\nkept\n<!-- /block: by-hand -->\n"
    )
    updated = document.update(text, {})
    assert document.update(updated, {}) == updated
    areas = document.parse(updated)
    # The placeholder of an empty area goes once the area has anything else.
    assert areas[document.STORAGE] == [(None, "A note by hand.")]
    assert "--only storage`" not in updated
    assert (
        "by-hand",
        "<!-- block: by-hand -->\nkept\n<!-- /block: by-hand -->",
    ) in areas[document.SCALE]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--only", "big,layers", "--out", "x.md"], "`python -m tests.benchmarks --only big,layers`"),
        (
            ["--runs", "5", "--work-dir", "/tmp/w", "--keep-work-dir"],
            "`python -m tests.benchmarks --only big,layers --runs 5` "
            "(in a run of `python -m tests.benchmarks --runs 5`)",
        ),
        (["--only=layers,big"], "`python -m tests.benchmarks --only big,layers`"),
    ],
)
def test_the_command_of_a_block(argv: list[str], expected: str) -> None:
    assert document.command_for(document.BY_KEY["big-layers"], argv) == expected


def test_the_plots_write_pngs_from_figures(tmp_path: Path) -> None:
    from tests.benchmarks import plots

    written = [
        plots.scale(
            {"project (Spark)": [(1_000_000, 0.26), (5_000_000, 1.04)], "DuckDB": [(1_000_000, 0.25)]},
            tmp_path / "img" / "scale.png",
            cores=2,
        ),
        plots.shapes([("base", 0.79, 1.17, 0.67), ("100 keys", 0.28, 0.60, 0.47)], tmp_path / "shapes.png"),
        plots.dirty_share([0.1, 1.0], [0.15, 0.16], [0.42, 0.33], 3.02, "5M/500k", tmp_path / "share.png"),
    ]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
