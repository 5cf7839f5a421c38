"""The zip of the code the compactor's tasks import, as shipped to a cluster's executors."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from compactor.cluster import build_code_zip, code_zip, one_line


def test_the_zip_holds_the_packages_tasks_import_and_is_built_once(tmp_path: Path) -> None:
    first = code_zip()
    assert code_zip() == first
    names = set(zipfile.ZipFile(first).namelist())
    assert {"compactor/__init__.py", "compactor/arrow_phases.py", "ledger/schema.py"} <= names
    assert not any(n.startswith(("service/", "api/")) for n in names)
    # Same sources, same bytes, same name: Spark refuses one file name with two contents.
    assert build_code_zip(tmp_path).name == first.name


def test_the_zipped_arrow_phases_import_without_the_project_installed(tmp_path: Path) -> None:
    # -S -I: no site packages and no current directory; only the zip and the Python libraries
    # an executor has (those of this interpreter) on the path.
    site = [p for p in sys.path if p.endswith("site-packages")]
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]; sys.path += sys.argv[2:]; "
        "import compactor.arrow_phases as a; assert a.__file__.startswith(sys.argv[1]), a.__file__; "
        "import importlib.util; assert importlib.util.find_spec('service') is None"
    )
    subprocess.run([sys.executable, "-S", "-I", "-c", code, str(code_zip()), *site], check=True, cwd=tmp_path)


def test_one_line_takes_the_python_error_out_of_a_task_failure() -> None:
    text = (
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        "  File \"x.py\", line 1\nModuleNotFoundError: No module named 'compactor'\n SQLSTATE: 38000"
    )
    assert one_line(RuntimeError(text)) == "ModuleNotFoundError: No module named 'compactor'"
    assert one_line(ValueError("first\nsecond")) == "ValueError: first"
