"""The client's API reference builds from its docstrings (``make docs``), strictly: a reference
in a docstring or a page that names nothing fails the build, and so this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_client_reference_builds_strictly(tmp_path: Path) -> None:
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
    # Every public name has its entry, with its docstring.
    pages = "".join(p.read_text() for p in site.rglob("*.html"))
    for name in (
        "api.client.Client",
        "api.client.AsyncClient",
        "api.client.MessageId",
        "api.client.TableView",
    ):
        assert f'id="{name}"' in pages, name
    assert "wait_for_compaction" in pages and "ConsumerBusy" in pages
