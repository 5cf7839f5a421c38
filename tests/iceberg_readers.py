"""Engines that read the service's Iceberg tables, for the tests: DuckDB with its iceberg
extension.

DuckDB cannot download extensions here (no route to its extension host): the extensions come
as PyPI packages (``duckdb-extension-{httpfs,avro,iceberg}``, built for DuckDB 1.5.5 only),
each a wheel holding one signed ``.duckdb_extension`` file, loaded by path.
"""

from __future__ import annotations

import glob
import os
from types import ModuleType

import duckdb

# avro: manifests; httpfs: the REST catalog and S3 (ATTACH tries to install it when absent).
EXTENSIONS = ("httpfs", "avro", "iceberg")


def _extension_file(package: ModuleType, name: str) -> str:
    found = glob.glob(
        os.path.join(os.path.dirname(package.__file__ or ""), "extensions", "*", f"{name}.duckdb_extension")
    )
    if not found:
        raise FileNotFoundError(f"no {name}.duckdb_extension in {package.__name__}")
    return found[0]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with httpfs, avro and iceberg loaded."""
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    packages = {
        "httpfs": duckdb_extension_httpfs,
        "avro": duckdb_extension_avro,
        "iceberg": duckdb_extension_iceberg,
    }
    con = duckdb.connect()
    for name in EXTENSIONS:
        con.execute(f"LOAD '{_extension_file(packages[name], name)}'")
    return con
