"""``floodwall spool ls|show|replay|purge``: inspect and operate a spool directory.

``ls`` and ``show`` only read (safe on a running proxy's spool). ``replay`` and ``purge``
take the spool's lock, so they refuse while a proxy runs on it. ``replay`` publishes
straight to the broker with publisher confirms, via the default exchange to the queue the
record was spooled for (``--original-routing``: to the record's exchange and routing key,
which may reach other queues too), and deletes each record once confirmed: at least once,
like the proxy's own replay. AMQP 1.0 records go over AMQP 1.0 straight to the queue
(``/queues/QUEUE`` on RabbitMQ 4, ``/amq/queue/QUEUE`` before; with ``--original-routing``: to
the address the client sent them to), settled ``accepted``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from floodwall.cli.tls import upstream_settings, upstream_tls_options
from floodwall.control.policy import format_bytes
from floodwall.ops.config import AmqpCredentials, ConfigError, ManagementCredentials
from floodwall.spool.inspect import (
    QueueSummary,
    Scan,
    queue_dir,
    queue_dirs,
    summarize,
    unreadable_entries,
)
from floodwall.spool.log import RecoveryReport, SpoolError
from floodwall.spool.manager import QueueKey, SpoolManager
from floodwall.spool.records import SpoolRecord

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from floodwall.io.spool import SessionResult
    from floodwall.io.tls import UpstreamTlsContext
    from floodwall.io.upstreams import Upstreams
    from floodwall.spool.log import QueueSpool

_DIR_OPTION = click.option(
    "--spool-dir", "spool_dir", required=True, envvar="FLOODWALL_SPOOL_DIR",
    type=click.Path(file_okay=False, exists=True), help="The proxy's --spool-dir.")
_VHOST_OPTION = click.option("--vhost", default="/", show_default=True,
                             help="The queue's vhost.")


@click.group()
def spool() -> None:
    """Inspect and operate the spool (of a stopped proxy; ls and show also while it runs)."""


def _age(accepted_at: float | None, now: float) -> str:
    if accepted_at is None:
        return "-"
    seconds = max(0.0, now - accepted_at)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _shown(name: str) -> str:
    """A vhost or queue name for the terminal: as it is when it prints as itself, else
    quoted with its control characters escaped (a name cannot move the cursor)."""
    return name if name and name.isprintable() and name.strip() == name else ascii(name)


def _find(root: Path, key: QueueKey) -> Path:
    try:
        directory = queue_dir(root, key)
    except OSError as exc:  # SpoolPathError: the name resolves outside the root
        raise click.ClickException(exc.strerror or str(exc)) from None
    if not directory.is_dir():
        known = ", ".join(f"{_shown(q)}@{_shown(v)}" for (v, q), _ in queue_dirs(root)) \
            or "none"
        raise click.ClickException(f"no spool for queue {key[1]!r} in vhost {key[0]!r} "
                                   f"under {root} (spooled queues: {known})")
    return directory


@spool.command("ls")
@_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def ls(spool_dir: str, as_json: bool) -> None:
    """Per queue: records, bytes, oldest record's age, segments."""
    root = Path(spool_dir)
    now = time.time()
    summaries = [summarize(d, key) for key, d in queue_dirs(root)]
    unreadable = unreadable_entries(root)
    if as_json:
        click.echo(json.dumps([_summary_doc(s, now) for s in summaries], indent=2))
        for entry in unreadable:
            click.echo(f"skipped {entry.path}: {entry.reason}", err=True)
        return
    rows = [("VHOST", "QUEUE", "RECORDS", "BYTES", "OLDEST", "SEGMENTS", "NOTES")]
    for s in summaries:
        notes = []
        if s.torn_tail_bytes:
            notes.append(f"torn tail {s.torn_tail_bytes} B (dropped on start)")
        if s.skipped_bytes:
            notes.append(f"damaged {s.skipped_bytes} B skipped (dropped on start)")
        notes += s.problems
        rows.append((_shown(s.key[0]), _shown(s.key[1]), str(s.records),
                     format_bytes(s.bytes), _age(s.oldest_accepted_at, now), str(s.segments),
                     "; ".join(notes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    click.echo(f"# {sum(s.records for s in summaries)} records, "
               f"{format_bytes(sum(s.bytes for s in summaries))} in {len(summaries)} queues "
               f"under {root}")
    for entry in unreadable:
        click.echo(f"# skipped {entry.path}: {entry.reason}")


def _summary_doc(s: QueueSummary, now: float) -> dict[str, object]:
    return {"vhost": s.key[0], "queue": s.key[1], "records": s.records, "bytes": s.bytes,
            "segments": s.segments, "first_seq": s.first_seq, "last_seq": s.last_seq,
            "confirmed_seq": s.confirmed_seq,
            "oldest_age_seconds": None if s.oldest_accepted_at is None
            else round(now - s.oldest_accepted_at, 3),
            "torn_tail_bytes": s.torn_tail_bytes, "skipped_bytes": s.skipped_bytes,
            "problems": list(s.problems)}


def _replay_run(qspool: QueueSpool, upstreams: Upstreams, credentials: AmqpCredentials,
                vhost: str, queue: str, tls: UpstreamTlsContext | None, original_routing: bool,
                window: int) -> Coroutine[Any, Any, SessionResult]:
    """The replay session of ``floodwall spool replay``: its own 0-9-1 connection (and a 1.0
    one when a record needs it), to the queue itself unless ``original_routing``."""
    from floodwall.io.amqp10_client import Amqp10Client
    from floodwall.io.amqp_client import AmqpClient
    from floodwall.io.spool import Amqp10Records, queue_exists, replay_session

    def target(rec: SpoolRecord) -> tuple[str, str]:
        return (rec.exchange, rec.routing_key) if original_routing else ("", queue)

    def address(rec: SpoolRecord) -> str | None:  # an AMQP 1.0 record's (None: the queue)
        return rec.address if original_routing else None

    async def run() -> SessionResult:
        client = AmqpClient(upstreams, credentials.username, credentials.password, vhost,
                            tls=tls)
        client10: Amqp10Client | None = None

        async def connect10() -> Amqp10Client:
            nonlocal client10
            if client10 is None:
                client10 = Amqp10Client(upstreams, credentials.username,
                                        credentials.password, vhost, tls=tls)
                await client10.connect(10.0)
            return client10

        records10 = Amqp10Records(connect10, queue, address, 10.0)
        await client.connect()
        try:
            publisher = await client.open_publisher(window)
            return await replay_session(
                qspool, publisher, target, lambda: None, amqp10=records10,
                queue_exists=lambda: queue_exists(client, queue))
        finally:
            await records10.close()
            if client10 is not None:
                await client10.close()
            await client.close()

    return run()


@spool.command()
@click.argument("queue")
@_DIR_OPTION
@_VHOST_OPTION
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0),
              help="Most records shown (0: all).")
@click.option("--peek", default=32, show_default=True, type=click.IntRange(min=0),
              help="Bytes of each body shown.")
def show(queue: str, spool_dir: str, vhost: str, limit: int, peek: int) -> None:
    """QUEUE's spooled records, oldest first: seq, time, exchange, routing key, body."""
    root = Path(spool_dir)
    key = (vhost, queue)
    scan = Scan(_find(root, key), key)
    click.echo("SEQ\tACCEPTED (UTC)\tEXCHANGE OR 1.0 ADDRESS\tROUTING KEY\tBODY BYTES\tBODY")
    shown = 0
    for rec in scan.records():
        if limit and shown >= limit:
            break
        shown += 1
        when = datetime.datetime.fromtimestamp(rec.accepted_at, datetime.UTC)
        exchange, routing_key = ((f"(amqp10) {_shown(rec.address)}", "") if rec.amqp10
                                 else (_shown(rec.exchange) if rec.exchange else "(default)",
                                       _shown(rec.routing_key) if rec.routing_key else ""))
        click.echo(f"{rec.seq}\t{when.isoformat(timespec='milliseconds')}\t"
                   f"{exchange}\t{routing_key}\t{len(rec.body)}\t"
                   f"{rec.body[:peek]!r}{'...' if len(rec.body) > peek else ''}")
    if limit and shown >= limit:
        click.echo(f"# first {shown} shown (--limit)")
    for problem in scan.summary.problems:
        click.echo(f"# {problem}")


@spool.command()
@click.argument("queue")
@_DIR_OPTION
@_VHOST_OPTION
@click.option("--upstream", required=True, envvar="FLOODWALL_UPSTREAM",
              help="The broker: HOST:PORT, amqp://HOST[:PORT] or amqps://HOST[:PORT] (login: "
                   "FLOODWALL_AMQP_USERNAME / _PASSWORD / _PASSWORD_FILE, else the management "
                   "ones, else guest; or --upstream-tls-sasl-external).")
@upstream_tls_options
@click.option("--original-routing", is_flag=True,
              help="Publish to each record's exchange and routing key, or an AMQP 1.0 "
                   "record's address (may reach other queues too), instead of straight to "
                   "QUEUE.")
@click.option("--window", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Unconfirmed publishes in flight.")
def replay(queue: str, spool_dir: str, vhost: str, upstream: str, original_routing: bool,
           window: int, **tls_options: Any) -> None:
    """Publish QUEUE's spooled records to the broker with confirms; delete as confirmed."""
    from floodwall.io.amqp_client import AmqpClientError
    from floodwall.io.tls import UpstreamTlsContext
    from floodwall.io.upstreams import Upstreams

    root = Path(spool_dir)
    key = (vhost, queue)
    _find(root, key)
    try:
        nodes, tls_settings = upstream_settings(upstream, **tls_options)
        upstreams = Upstreams(nodes)
        credentials = AmqpCredentials.from_environment(
            fallback=ManagementCredentials.from_environment())
        tls = UpstreamTlsContext(tls_settings) if tls_settings is not None else None
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (OSError, ValueError) as exc:  # a certificate, key or CA file that does not load
        raise click.UsageError(f"--upstream-tls-ca/-cert/-key: {exc}") from None
    manager = SpoolManager(root)
    try:
        manager.lock()
        qspool = manager.spool(key)
        _echo_recovery(qspool.report)
        records, nbytes = qspool.pending_records, qspool.pending_bytes
        click.echo(f"replaying {records} records ({format_bytes(nbytes)}) of {queue!r} "
                   f"(vhost {vhost!r}) to {'amqps://' if tls else ''}{upstreams.label}")
        started = time.monotonic()

        run = _replay_run(qspool, upstreams, credentials, vhost, queue, tls,
                          original_routing, window)
        try:
            result = asyncio.run(run)
        except (AmqpClientError, OSError, TimeoutError) as exc:
            raise click.ClickException(f"broker {upstreams.label}: {exc}") from None
        seconds = time.monotonic() - started
        click.echo(f"replayed {result.confirmed} records ({format_bytes(result.confirmed_bytes)})"
                   f" in {seconds:.1f}s; {qspool.pending_records} left")
        if result.reason != "empty":
            hint = (" (is the queue there? unroutable records are kept)"
                    if result.reason == "returned" else "")
            raise click.ClickException(f"replay stopped: {result.reason}{hint}")
    except SpoolError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        manager.close()


def _echo_recovery(report: RecoveryReport) -> None:
    """What opening the spool found besides whole records (torn tail, damage, strays)."""
    if report.torn_tail_bytes:
        click.echo(f"# torn tail of {report.torn_tail_bytes} B dropped (an interrupted append)")
    if report.skipped_bytes:
        click.echo(f"# {report.skipped_bytes} damaged bytes skipped, {report.lost_records} "
                   "unconfirmed records in them lost")
    for problem in report.problems:
        click.echo(f"# {problem}")


@spool.command()
@click.argument("queue")
@_DIR_OPTION
@_VHOST_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(queue: str, spool_dir: str, vhost: str, yes: bool) -> None:
    """Delete QUEUE's spool: its records never reach the broker."""
    root = Path(spool_dir)
    key = (vhost, queue)
    directory = _find(root, key)
    manager = SpoolManager(root)
    try:
        manager.lock()
        s = summarize(directory, key)
        if not yes:
            click.confirm(f"Delete {s.records} spooled records ({format_bytes(s.bytes)}) of "
                          f"queue {queue!r} in vhost {vhost!r}? They will never reach the "
                          f"broker", abort=True)
        manager.purge(key)
        click.echo(f"purged {s.records} records ({format_bytes(s.bytes)}) of {queue!r}")
    except SpoolError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        manager.close()
