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

from ledger.storage import S3Settings

# avro: manifests; httpfs: the REST catalog and S3 (ATTACH tries to install it when absent).
EXTENSIONS = ("httpfs", "avro", "iceberg")


def _extension_file(package: ModuleType, name: str) -> str:
    found = glob.glob(
        os.path.join(os.path.dirname(package.__file__ or ""), "extensions", "*", f"{name}.duckdb_extension")
    )
    if not found:
        raise FileNotFoundError(f"no {name}.duckdb_extension in {package.__name__}")
    return found[0]


def duckdb_connection(s3: S3Settings | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with httpfs, avro and iceberg loaded; with ``s3``,
    it reads ``s3://`` locations from that endpoint (path-style, as ``.ci/s3``'s gateway wants),
    with its keys or else the ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` of the tests."""
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
    if s3 is not None:
        # Explicit keys: a credential-chain secret needs DuckDB's aws extension too (another
        # package, duckdb-extension-aws, that the tests do without).
        options = {
            "KEY_ID": s3.access_key or os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "SECRET": s3.secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "REGION": s3.region or "us-east-1",
        }
        if s3.endpoint_url:
            scheme, _, host = s3.endpoint_url.partition("://")
            options.update(ENDPOINT=host, URL_STYLE="path", USE_SSL=str(scheme == "https").lower())
        names = ", ".join(
            f"{name} ?" if name != "USE_SSL" else f"{name} {value}" for name, value in options.items()
        )
        con.execute(f"CREATE SECRET s3 (TYPE s3, {names})", [v for k, v in options.items() if k != "USE_SSL"])
    return con
