"""``compactor topics ...``: a ``pulsar-admin``-like command line on the sync client.

::

    compactor topics create public/default/orders
    compactor topics produce public/default/orders -k a -m v1 -n 3
    compactor topics compact public/default/orders --wait
    compactor topics consume public/default/orders -s sub --read-compacted --initial-position earliest -n 0
    compactor topics consume public/default/orders -s workers --subscription-type Shared -n 0
    compactor topics stats public/default/orders

The service is ``--url`` (before or after the command), else ``$COMPACTOR_URL``, else
http://127.0.0.1:8080; with several instances it may list some, ``http://a:8080,http://b:8080``,
and a request for a topic another instance owns follows its redirect there. A service with
authentication wants ``--auth-token T`` (before or after the command), else
``$COMPACTOR_AUTH_TOKEN`` (``--auth-token file:///path`` reads the token from a file, as
``pulsar-admin --auth-params``). A client error prints ``error: <reason>`` and exits with 1.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlparse

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from api.client import (
    DEFAULT_URL,
    AuthenticationToken,
    Client,
    ClientError,
    CompactionStatus,
    Message,
    OutgoingMessage,
    Timeout,
)

topics_app = typer.Typer(
    help="Topics: create, list, delete, inspect, compact, produce, consume (as pulsar-admin topics).",
    no_args_is_help=True,
)

TopicArg = Annotated[
    str, typer.Argument(help="persistent://tenant/namespace/topic or tenant/namespace/topic.")
]
UrlOpt = Annotated[
    str | None, typer.Option("--url", help="Service URL (overrides the one before the command).")
]
AuthTokenOpt = Annotated[
    str | None,
    typer.Option(
        "--auth-token", help="Token (or file:///path) for a service with authentication.", show_default=False
    ),
]
WaitTimeoutOpt = Annotated[float, typer.Option("--timeout", help="Give up waiting after this many seconds.")]


class InitialPosition(StrEnum):
    earliest = "earliest"
    latest = "latest"


class SubscriptionType(StrEnum):
    """Pulsar's names, as ``pulsar-client consume --subscription-type`` takes them."""

    Exclusive = "Exclusive"
    Failover = "Failover"
    Shared = "Shared"
    Key_Shared = "Key_Shared"


@dataclass(frozen=True)
class _Target:
    url: str
    auth_token: str | None
    trust_certs: str | None


@topics_app.callback()
def _topics(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", envvar="COMPACTOR_URL", help="Service URL.")] = DEFAULT_URL,
    auth_token: Annotated[
        str | None,
        typer.Option(
            "--auth-token",
            envvar="COMPACTOR_AUTH_TOKEN",
            help="Token (or file:///path) for a service with authentication.",
            show_default=False,
            show_envvar=False,  # never echo a token in the help
        ),
    ] = None,
    tls_trust_certs_file_path: Annotated[
        str | None,
        typer.Option(
            "--tls-trust-certs-file-path",
            envvar="COMPACTOR_TLS_TRUST_CERTS_FILE_PATH",
            help="CA certificates to trust for an https:// service.",
        ),
    ] = None,
) -> None:
    ctx.obj = _Target(url, auth_token, tls_trust_certs_file_path)


def _authentication(token: str | None) -> AuthenticationToken | None:
    if not token:
        return None
    if token.startswith("file:"):
        path = Path(unquote(urlparse(token).path))
        # A function: read again on a 401, so a renewed token file is picked up.
        return AuthenticationToken(lambda: path.read_text().strip())
    return AuthenticationToken(token)


@contextmanager
def _client(ctx: typer.Context, url: str | None, auth_token: str | None = None) -> Iterator[Client]:
    """A client of ``--url``; client errors become ``error: <reason>`` and exit code 1."""
    target: _Target = ctx.obj or _Target(DEFAULT_URL, None, None)
    try:
        with Client(
            url or target.url,
            authentication=_authentication(auth_token or target.auth_token),
            tls_trust_certs_file_path=target.trust_certs,
        ) as client:
            yield client
    except (ClientError, ValueError, TypeError, OSError) as e:
        reason = e.reason if isinstance(e, ClientError) else str(e)
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(1) from None


def _json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


@topics_app.command()
def create(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None) -> None:
    """Create a topic."""
    with _client(ctx, url, auth_token) as c:
        c.admin.topics.create(topic)
    typer.echo(f"created {topic}")


@topics_app.command("list")
def list_(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(help="tenant/namespace")],
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """List the topics of a namespace, one per line."""
    with _client(ctx, url, auth_token) as c:
        for name in c.admin.topics.list(namespace):
            typer.echo(name)


@topics_app.command()
def lookup(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None) -> None:
    """The URL of the instance that serves the topic (several instances)."""
    with _client(ctx, url, auth_token) as c:
        typer.echo(c.admin.topics.lookup(topic))


@topics_app.command()
def delete(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None) -> None:
    """Delete a topic and all its data."""
    with _client(ctx, url, auth_token) as c:
        c.admin.topics.delete(topic)
    typer.echo(f"deleted {topic}")


@topics_app.command()
def stats(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None) -> None:
    """Counters and per-subscription backlog, as JSON."""
    with _client(ctx, url, auth_token) as c:
        _json(c.admin.topics.stats(topic))


@topics_app.command("internal-stats")
def internal_stats(
    ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None
) -> None:
    """Ledgers, cursors, the compacted ledger and the horizon, as JSON."""
    with _client(ctx, url, auth_token) as c:
        _json(c.admin.topics.internal_stats(topic))


# How often --wait asks for the status: often enough for a bar that moves.
WAIT_POLL_S = 0.25


def _progress_text(st: CompactionStatus) -> str:
    p = st.progress
    if p is None:
        return st.status
    return f"{st.status} {p.phase} {p.percent:.1f}% ({p.entries_read:,}/{p.entries_total:,} entries)"


def _await_compaction(c: Client, topic: str, timeout: float) -> CompactionStatus:
    """Wait while the compaction runs: a progress bar (phase, percent) on a terminal, else a
    plain line per change of phase or percent, for logs and pipes."""
    if not sys.stdout.isatty():
        last: list[str] = []

        def line(st: CompactionStatus, elapsed: float) -> None:
            text = _progress_text(st)
            if st.running and text not in last[-1:]:
                last.append(text)
                typer.echo(f"compacting {topic}: {text}")

        return c.admin.topics.wait_for_compaction(
            topic, timeout=timeout, poll_interval=WAIT_POLL_S, on_progress=line
        )
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"compacting {topic}", total=100)

        def draw(st: CompactionStatus, elapsed: float) -> None:
            phase = st.progress.phase if st.progress is not None else st.status
            bar.update(task, description=f"compacting {topic}: {phase}", completed=_percent(st))

        return c.admin.topics.wait_for_compaction(
            topic, timeout=timeout, poll_interval=WAIT_POLL_S, on_progress=draw
        )


def _percent(st: CompactionStatus) -> float:
    if st.progress is not None:
        return st.progress.percent
    return 0.0 if st.running else 100.0


def _report(topic: str, st: CompactionStatus) -> None:
    typer.echo(f"compaction of {topic}: {st.status}")
    if st.status == CompactionStatus.ERROR:
        typer.echo(f"error: {st.last_error or 'compaction failed'}", err=True)
        raise typer.Exit(1)


@topics_app.command()
def compact(
    ctx: typer.Context,
    topic: TopicArg,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait until it is done, showing progress.")
    ] = False,
    timeout: WaitTimeoutOpt = 600.0,
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """Start a compaction (and with --wait, wait for it; exit 1 if it fails)."""
    with _client(ctx, url, auth_token) as c:
        c.admin.topics.compact(topic)
        if not wait:
            typer.echo(f"compaction of {topic} started")
            return
        st = _await_compaction(c, topic, timeout)
    _report(topic, st)


@topics_app.command()
def scrub(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None, auth_token: AuthTokenOpt = None) -> None:
    """Verify every file of the topic against its recorded checksum now, as JSON; exit 1 when
    damage is found (or the scrub fails), so that a cron job notices."""
    with _client(ctx, url, auth_token) as c:
        report = c.admin.topics.scrub(topic)
    _json(report)
    if report.get("status") != "CLEAN":
        raise typer.Exit(1)


@topics_app.command("skip-damaged")
def skip_damaged(
    ctx: typer.Context,
    topic: TopicArg,
    ledger_id: Annotated[int, typer.Argument(help="The damaged original ledger's id.", min=0)],
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """Accept losing a damaged ledger's unreadable entries (reads and compaction go on without
    them), as JSON: the entries lost and kept."""
    with _client(ctx, url, auth_token) as c:
        _json(c.admin.topics.skip_damaged(topic, ledger_id))


@topics_app.command("compaction-status")
def compaction_status(
    ctx: typer.Context,
    topic: TopicArg,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait while it is RUNNING, showing progress.")
    ] = False,
    timeout: WaitTimeoutOpt = 600.0,
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """Show the status of the last compaction: NOT_RUN, RUNNING, SUCCESS or ERROR (exit 1)."""
    with _client(ctx, url, auth_token) as c:
        st = _await_compaction(c, topic, timeout) if wait else c.admin.topics.compaction_status(topic)
    _report(topic, st)


@topics_app.command()
def produce(
    ctx: typer.Context,
    topic: TopicArg,
    messages: Annotated[
        list[str] | None, typer.Option("--messages", "-m", help="A value (UTF-8); repeat for several.")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="The key of every message.")] = None,
    num_produce: Annotated[
        int, typer.Option("--num-produce", "-n", min=1, help="Send each value N times.")
    ] = 1,
    tombstone: Annotated[
        bool, typer.Option("--tombstone", help="Send a tombstone (null value) for --key.")
    ] = False,
    properties: Annotated[
        list[str] | None, typer.Option("--property", "-p", help="key=value, repeatable.")
    ] = None,
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """Produce messages; prints how many and their ids' range."""
    if tombstone == bool(messages):
        raise typer.BadParameter("give either -m VALUE (one or more) or --tombstone")
    if tombstone and key is None:
        raise typer.BadParameter("a tombstone needs --key")
    props: dict[str, str] = {}
    for p in properties or []:
        name, sep, value = p.partition("=")
        if not sep:
            raise typer.BadParameter(f"property {p!r} is not key=value")
        props[name] = value
    values: list[str | None] = [None] if tombstone else list(messages or [])
    batch = [OutgoingMessage(v, key=key, properties=props) for _ in range(num_produce) for v in values]
    with _client(ctx, url, auth_token) as c:
        ids = c.create_producer(topic).send_many(batch)
    span = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]} .. {ids[-1]}"
    typer.echo(f"{len(ids)} message{'s' if len(ids) != 1 else ''} produced: {span}")


def _show(msg: Message) -> str:
    value = msg.value()
    if value is None:
        text = "<tombstone>"
    else:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = "base64:" + base64.b64encode(value).decode()
    line = f"{msg.message_id()}  key={msg.key() if msg.key() is not None else '<none>'}  value={text}"
    if msg.properties():
        line += f"  properties={json.dumps(msg.properties())}"
    return line


@topics_app.command()
def consume(
    ctx: typer.Context,
    topic: TopicArg,
    subscription: Annotated[str, typer.Option("--subscription-name", "-s", help="The subscription.")],
    num_messages: Annotated[
        int, typer.Option("--num-messages", "-n", min=0, help="Stop after N messages (0: never).")
    ] = 1,
    read_compacted: Annotated[
        bool, typer.Option("--read-compacted", help="This consumer reads the compacted topic.")
    ] = False,
    initial_position: Annotated[
        InitialPosition, typer.Option("--initial-position", help="Where a new subscription starts.")
    ] = InitialPosition.latest,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop when no message came for this many seconds.")
    ] = None,
    subscription_type: Annotated[
        SubscriptionType,
        typer.Option("--subscription-type", "-t", help="Pulsar's subscription type of this consumer."),
    ] = SubscriptionType.Exclusive,
    consumer_name: Annotated[
        str | None, typer.Option("--consumer-name", help="The consumer's name (Failover orders by it).")
    ] = None,
    priority_level: Annotated[
        int, typer.Option("--priority-level", min=0, help="Failover: lower is chosen active first.")
    ] = 0,
    url: UrlOpt = None,
    auth_token: AuthTokenOpt = None,
) -> None:
    """Receive messages on a subscription, print them (id, key, value) and acknowledge them."""
    wait_ms = None if timeout is None else int(timeout * 1000)
    received = 0
    with _client(ctx, url, auth_token) as c:
        consumer = c.subscribe(
            topic,
            subscription,
            read_compacted=read_compacted,
            initial_position=initial_position.value,
            receiver_queue_size=min(num_messages or 100, 100),
            subscription_type=subscription_type.value,
            consumer_name=consumer_name,
            priority_level=priority_level,
        )
        try:
            while num_messages == 0 or received < num_messages:
                try:
                    msg = consumer.receive(timeout_millis=wait_ms)
                except Timeout:
                    break
                typer.echo(_show(msg))
                consumer.acknowledge(msg)
                received += 1
        except KeyboardInterrupt:
            pass
        finally:
            consumer.close()
    typer.echo(f"{received} message{'s' if received != 1 else ''} consumed", err=True)
