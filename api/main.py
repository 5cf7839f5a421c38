"""The ``compactor`` console script, the top of the house: ``compactor topics`` (the client's
command line), and with the server extra ``compactor serve``, ``compactor db upgrade`` and
``compactor tokens``.

The base install (``pip install topic-compactor``) is the client and ``compactor topics``;
the other commands need ``pip install 'topic-compactor[server]'`` and, without it, say so in
one line. So this module imports the service only inside those commands.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from api.cli import topics_app

SERVER_EXTRA = "topic-compactor[server]"
#: What the service imports that the base install lacks (import names of the server extra).
SERVER_MODULES = (
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pyspark",
    "pyarrow",
    "pandas",
    "pydantic_settings",
    "crc32c",
    "jwt",
    "prometheus_client",
)
#: What ``compactor tokens`` imports.
TOKEN_MODULES = ("jwt", "cryptography")

app = typer.Typer(help="A Pulsar-style topic compaction service.", no_args_is_help=True)
db_app = typer.Typer(help="The metadata database (server extra).", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(db_app, name="db")


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are not installed (looked up, not imported)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require_server(command: str, modules: tuple[str, ...] = SERVER_MODULES) -> None:
    """Exit with one line naming the extra to install when ``modules`` are not all there."""
    absent = missing(modules)
    if absent:
        typer.echo(
            f"error: compactor {command} needs the server: pip install '{SERVER_EXTRA}' "
            f"({', '.join(absent)} not installed)",
            err=True,
        )
        raise typer.Exit(2)


if missing(TOKEN_MODULES):

    @app.command(
        "tokens",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def tokens(ctx: typer.Context) -> None:
        """Keys and tokens for authentication (server extra)."""
        require_server("tokens", TOKEN_MODULES)

else:
    from api.tokens_cli import tokens_app

    app.add_typer(tokens_app, name="tokens")


def _env(name: str, value: object) -> None:
    # Options override the environment by becoming it: Settings reads one source of truth.
    if value is not None:
        os.environ[f"COMPACTOR_{name}"] = str(value)


def _broker_port_refusal(host: str, port: int, setting: str = "COMPACTOR_BROKER_SERVICE_PORT") -> str | None:
    """Why the port of Pulsar's binary protocol cannot be listened on (another broker, a Pulsar
    standalone, on 6650), or None; checked before start-up, so it is one line, not a trace."""
    if port == 0:
        return None
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        return f"cannot resolve {host} for Pulsar's binary protocol: {e}"
    port_off = setting == "COMPACTOR_BROKER_SERVICE_PORT"  # the plain port's 0 is off, not any
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as e:
                return (
                    f"cannot listen for Pulsar's binary protocol on {host}:{port}: {e.strerror}; set "
                    f"{setting} to a free port" + (", or 0 to turn the protocol off" if port_off else "")
                )
    return None


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on [COMPACTOR_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [COMPACTOR_PORT].")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Storage root [COMPACTOR_DATA_DIR].")] = None,
    storage_url: Annotated[
        str | None,
        typer.Option(help="Ledger storage: a directory or s3://bucket/prefix [COMPACTOR_STORAGE_URL]."),
    ] = None,
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL [COMPACTOR_DATABASE_URL].")] = None,
    fsync: Annotated[str | None, typer.Option(help="always|interval|never [COMPACTOR_FSYNC].")] = None,
    wal: Annotated[
        str | None,
        typer.Option(help="Write-ahead log: local (files) or object (the ledger storage) [COMPACTOR_WAL]."),
    ] = None,
    spark_master: Annotated[str | None, typer.Option(help="Spark master [COMPACTOR_SPARK_MASTER].")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "info",
) -> None:
    """Serve the REST API, after applying migrations and recovering every topic (server extra)."""
    require_server("serve")
    from service.settings import Settings

    for name, value in (
        ("HOST", host),
        ("PORT", port),
        ("DATA_DIR", data_dir),
        ("STORAGE_URL", storage_url),
        ("DATABASE_URL", database_url),
        ("FSYNC", fsync),
        ("WAL", wal),
        ("SPARK_MASTER", spark_master),
    ):
        _env(name, value)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Every admin change is audited, whatever the log level of the rest.
    logging.getLogger("compactor.audit").setLevel(logging.INFO)
    try:
        settings = Settings()
    except Exception as e:  # pydantic's ValidationError: show it as a usage error, not a trace
        raise typer.BadParameter(str(e)) from None
    refusal = settings.exposure_refusal()
    if refusal is not None:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)
    for port, name in (
        (settings.broker_service_port, "COMPACTOR_BROKER_SERVICE_PORT"),
        (settings.broker_service_port_tls or 0, "COMPACTOR_BROKER_SERVICE_PORT_TLS"),
    ):
        refusal = _broker_port_refusal(settings.host, port, name)
        if refusal is not None:
            typer.echo(f"error: {refusal}", err=True)
            raise typer.Exit(2)
    from service.instances import lock_sqlite_store

    refusal = lock_sqlite_store(settings.database_url)
    if refusal is not None:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)
    from ledger.storage import StorageError, check_storage

    try:  # a bucket that does not exist, credentials refused, an endpoint down: one line, now
        check_storage(settings.ledger_storage())
    except StorageError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    # Imported only now: a refusal above comes at once, without loading Spark and the app.
    from api.app import create_app
    from api.web_servers import serve as serve_web

    server_app = create_app(settings)
    # A page read allocates thousands of objects; with the default thresholds the collector
    # runs every few hundred and regularly walks the whole heap. Objects alive now (modules,
    # the app) never become garbage: freeze them out of every collection.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    serve_web(
        server_app,
        settings,
        log_level=log_level.lower(),
        # uvicorn's default (5 s) is shorter than client pools keep idle connections: a client
        # sending as the server closes one gets "connection reset".
        timeout_keep_alive=settings.keep_alive_seconds,
    )


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply pending migrations to the configured database."""
    require_server("db upgrade")
    from migrations import upgrade
    from service.settings import Settings

    settings = Settings()
    upgrade(settings.database_url, revision)
    typer.echo(f"database at {revision}: {settings.database_url}")


if __name__ == "__main__":
    app()
