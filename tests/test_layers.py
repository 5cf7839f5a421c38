"""The house's layers: imports only go downward, api -> service -> compactor -> ledger, and
``migrations`` is called from the top. The client (``api/client/``, ``api/cli.py``) is what the
base install holds, so it imports none of the server's packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER_PACKAGES = {"service", "compactor", "ledger", "migrations"}


def _imports(path: Path) -> set[str]:
    """The top-level packages a module imports, at any depth (lazy imports in functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _offenders(files: list[Path], forbidden: set[str]) -> dict[str, set[str]]:
    found = {str(f.relative_to(ROOT)): _imports(f) & forbidden for f in files}
    return {f: bad for f, bad in found.items() if bad}


def test_lower_layers_import_nothing_above_them() -> None:
    above = {
        "ledger": {"api", "service", "compactor", "migrations"},
        "compactor": {"api", "service", "migrations"},
        "service": {"api", "migrations"},
    }
    for package, forbidden in above.items():
        assert _offenders(sorted((ROOT / package).rglob("*.py")), forbidden) == {}, package


def test_the_client_and_its_cli_import_nothing_of_the_server() -> None:
    files = [*sorted((ROOT / "api").glob("client*.py")), *sorted((ROOT / "api" / "client").rglob("*.py"))]
    files.append(ROOT / "api" / "cli.py")
    forbidden = SERVER_PACKAGES | {"fastapi", "starlette", "pydantic", "sqlalchemy", "pyspark", "jwt"}
    assert _offenders(files, forbidden) == {}
