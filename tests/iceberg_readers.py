"""The engines the table tests read Iceberg tables with, set up as a user sets them up.

DuckDB's iceberg extension comes from PyPI (``duckdb-extension-iceberg`` and its companions
avro and httpfs, built for DuckDB 1.5.5: no extension host is reachable from the tests), loaded
by path; httpfs first, or an ATTACH of a REST catalog tries to install it.
"""

from __future__ import annotations

import glob
import os
from types import ModuleType

import duckdb


def _extension(module: ModuleType, name: str) -> str:
    """The ``.duckdb_extension`` file a ``duckdb-extension-<name>`` wheel ships."""
    found = glob.glob(
        os.path.join(os.path.dirname(str(module.__file__)), "extensions", "*", f"{name}.duckdb_extension")
    )
    assert found, f"the duckdb-extension-{name} package ships no {name}.duckdb_extension"
    return found[0]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the httpfs, avro and iceberg extensions loaded."""
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect()
    for module, name in (
        (duckdb_extension_httpfs, "httpfs"),
        (duckdb_extension_avro, "avro"),
        (duckdb_extension_iceberg, "iceberg"),
    ):
        con.execute(f"LOAD '{_extension(module, name)}'")
    return con
