"""``compactor topics ...``: a ``pulsar-admin``-like command line on the sync client.

::

    compactor topics create public/default/orders
    compactor topics produce public/default/orders -k a -m v1 -n 3
    compactor topics compact public/default/orders --wait
    compactor topics consume public/default/orders -s sub --read-compacted --initial-position earliest -n 0
    compactor topics stats public/default/orders

The service is ``--url`` (before or after the command), else ``$COMPACTOR_URL``, else
http://127.0.0.1:8080. A client error prints ``error: <reason>`` and exits with 1.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console

from api.client import DEFAULT_URL, Client, ClientError, CompactionStatus, Message, OutgoingMessage, Timeout

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
WaitTimeoutOpt = Annotated[float, typer.Option("--timeout", help="Give up waiting after this many seconds.")]


class InitialPosition(StrEnum):
    earliest = "earliest"
    latest = "latest"


@topics_app.callback()
def _topics(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", envvar="COMPACTOR_URL", help="Service URL.")] = DEFAULT_URL,
) -> None:
    ctx.obj = url


@contextmanager
def _client(ctx: typer.Context, url: str | None) -> Iterator[Client]:
    """A client of ``--url``; client errors become ``error: <reason>`` and exit code 1."""
    try:
        with Client(url or ctx.obj or DEFAULT_URL) as client:
            yield client
    except (ClientError, ValueError, TypeError) as e:
        reason = e.reason if isinstance(e, ClientError) else str(e)
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(1) from None


def _json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


@topics_app.command()
def create(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None) -> None:
    """Create a topic."""
    with _client(ctx, url) as c:
        c.admin.topics.create(topic)
    typer.echo(f"created {topic}")


@topics_app.command("list")
def list_(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Argument(help="tenant/namespace")],
    url: UrlOpt = None,
) -> None:
    """List the topics of a namespace, one per line."""
    with _client(ctx, url) as c:
        for name in c.admin.topics.list(namespace):
            typer.echo(name)


@topics_app.command()
def delete(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None) -> None:
    """Delete a topic and all its data."""
    with _client(ctx, url) as c:
        c.admin.topics.delete(topic)
    typer.echo(f"deleted {topic}")


@topics_app.command()
def stats(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None) -> None:
    """Counters and per-subscription backlog, as JSON."""
    with _client(ctx, url) as c:
        _json(c.admin.topics.stats(topic))


@topics_app.command("internal-stats")
def internal_stats(ctx: typer.Context, topic: TopicArg, url: UrlOpt = None) -> None:
    """Ledgers, cursors, the compacted ledger and the horizon, as JSON."""
    with _client(ctx, url) as c:
        _json(c.admin.topics.internal_stats(topic))


def _await_compaction(c: Client, topic: str, timeout: float) -> CompactionStatus:
    console = Console(stderr=True)
    with console.status(f"compacting {topic} ...") as status:

        def progress(st: CompactionStatus, elapsed: float) -> None:
            status.update(f"compacting {topic}: {st.status} {elapsed:.0f} s")

        return c.admin.topics.wait_for_compaction(topic, timeout=timeout, on_progress=progress)


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
) -> None:
    """Start a compaction (and with --wait, wait for it; exit 1 if it fails)."""
    with _client(ctx, url) as c:
        c.admin.topics.compact(topic)
        if not wait:
            typer.echo(f"compaction of {topic} started")
            return
        st = _await_compaction(c, topic, timeout)
    _report(topic, st)


@topics_app.command("compaction-status")
def compaction_status(
    ctx: typer.Context,
    topic: TopicArg,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait while it is RUNNING, showing progress.")
    ] = False,
    timeout: WaitTimeoutOpt = 600.0,
    url: UrlOpt = None,
) -> None:
    """Show the status of the last compaction: NOT_RUN, RUNNING, SUCCESS or ERROR (exit 1)."""
    with _client(ctx, url) as c:
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
    with _client(ctx, url) as c:
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
        bool, typer.Option("--read-compacted", help="Read the compacted topic.")
    ] = False,
    initial_position: Annotated[
        InitialPosition, typer.Option("--initial-position", help="Where a new subscription starts.")
    ] = InitialPosition.latest,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop when no message came for this many seconds.")
    ] = None,
    url: UrlOpt = None,
) -> None:
    """Receive messages on a subscription, print them (id, key, value) and acknowledge them."""
    wait_ms = None if timeout is None else int(timeout * 1000)
    received = 0
    with _client(ctx, url) as c:
        consumer = c.subscribe(
            topic,
            subscription,
            read_compacted=read_compacted,
            initial_position=initial_position.value,
            receiver_queue_size=min(num_messages or 100, 100),
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
