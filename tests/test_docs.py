"""The guide (docs/, mkdocs.yml) and the client's API reference build strictly (``make docs``): a
link between pages, or a reference in a docstring, that names nothing fails the build, and so this
test. The README stays short, and every relative link of README.md, BENCHMARKS.md and the guide
resolves: to a file that exists and, with ``#anchor``, to a heading of that file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

#: ``[text](target)`` and ``![alt](target)``, the text possibly over several lines; an optional title.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\{#([^}\s]+)\}|<a\s+(?:id|name)=[\"']([^\"']+)[\"']")


def _prose(text: str) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    out, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        m = FENCE.match(stripped)
        if m:
            if fence is None:
                fence = m.group(1)
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is None:
            out.append(line)
    return out


def _without_code_spans(text: str) -> str:
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", text, flags=re.DOTALL)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, characters other than letters, digits,
    spaces, hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (a repeated one numbered, as
    GitHub numbers it) and explicit ``{#id}`` or ``<a id=...>`` anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines = _prose(path.read_text())
    for line in lines:
        for m in EXPLICIT_ID.finditer(line):
            found.add(m.group(1) or m.group(2))
        m = HEADING.match(line)
        if not m:
            continue
        text = EXPLICIT_ID.sub("", m.group(2))
        slug = github_slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def relative_links(path: Path) -> list[str]:
    text = _without_code_spans("\n".join(_prose(path.read_text())))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^(https?:|mailto:)", t, re.IGNORECASE)]


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            broken.append(f"{target}: no heading of {file_part or path.name} has that anchor")
    return broken


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move the detail into the guide (docs/)"


def test_every_relative_link_of_the_readme_benchmarks_and_guide_resolves() -> None:
    documents = _documents()
    assert len(documents) > 10
    broken = {str(p.relative_to(ROOT)): b for p in documents if (b := broken_links(p))}
    assert broken == {}


def test_the_link_checker_finds_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text(
        "# Prometheus metrics: `GET /metrics`\n## Run it: the two commands\n## Again\n## Again\n"
        '<a id="spot"></a>\n## Custom {#mine}\n```\n# not a heading\n```\n'
    )
    (tmp_path / "a.md").write_text(
        "[ok](b.md#prometheus-metrics-get-metrics) [ok](b.md#run-it-the-two-commands)\n"
        "[ok](b.md#again-1) [ok](b.md#spot) [ok](b.md#mine) [ok](#top) [ok](https://x/y#z)\n"
        "`[in code](nowhere.md)` [bad](b.md#not-a-heading) [bad](missing.md)\n# Top\n"
        "[several\nlines](b.md#again)\n"
    )
    assert broken_links(tmp_path / "a.md") == [
        "b.md#not-a-heading: no heading of b.md has that anchor",
        "missing.md: no such file",
    ]


def test_the_guide_and_the_client_reference_build_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    site = tmp_path / "site"
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The guide's pages are in the site.
    concepts = (site / "concepts" / "index.html").read_text()
    assert "CompactedTopicLedger" in concepts and "readCompacted" in concepts
    assert "COMPACTOR_SPARK_MASTER" in (site / "settings" / "index.html").read_text()
    # Every public name of the client has its entry, with its docstring.
    pages = "".join(p.read_text() for p in site.rglob("*.html"))
    for name in (
        "api.client.Client",
        "api.client.AsyncClient",
        "api.client.MessageId",
        "api.client.TableView",
    ):
        assert f'id="{name}"' in pages, name
    assert "wait_for_compaction" in pages and "ConsumerBusy" in pages
