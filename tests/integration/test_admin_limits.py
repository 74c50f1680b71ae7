"""The admin endpoint of a real ``floodwall run`` against clients that cost it: ones that
never send their request or never read the answer are cut off after ``--admin-timeout``,
one past ``--admin-max-connections`` is answered 503 at once, and it all shows in /state,
/metrics and the log. A ``--management`` URL with a login is refused at start."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    capped,
    direct_params,
    log_lines,
    policy_file,
    start_flow,
)

pytestmark = pytest.mark.broker


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def admin_state(proc: ProxyProcess) -> dict[str, int]:
    doc = proc.state()["admin"]
    assert isinstance(doc, dict)
    return doc


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_silent_and_non_reading_clients_are_cut_and_one_past_the_cap_refused(
        start_floodwall: Callable[..., ProxyProcess]) -> None:
    proc = start_floodwall("--admin-max-connections", "4", "--admin-timeout", "1s")
    port = proc.admin_port

    silent = [connect(port) for _ in range(4)]  # connect, never send a request
    started = time.monotonic()
    extra = connect(port)
    extra.sendall(b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = read_all(extra)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"too many admin connections" in answer
    assert time.monotonic() - started < 1.0, "refused only after the silent ones were cut"
    for sock in silent:  # each closed by the proxy at its deadline
        assert read_all(sock) == b""
    assert time.monotonic() - started < 8

    # five clients that ask for /metrics and never read the answer
    greedy = []
    for _ in range(5):
        sock = connect(port, rcvbuf=1024)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        greedy.append(sock)
    wait_for(lambda: admin_state(proc)["connections"] == 1, 10,
             what="every handler of the greedy clients freed (only /state's own left)")
    doc = admin_state(proc)
    assert doc["max_connections"] == 4 and doc["timeout_seconds"] == 1.0
    assert doc["refused"] >= 1 and doc["timed_out"] >= 4
    assert proc.metric("floodwall_admin_refused_connections_total") >= 1
    assert proc.metric("floodwall_admin_timeouts_total") >= 4
    assert log_lines(proc.logfile, "admin_connection_refused")
    assert log_lines(proc.logfile, "admin_client_too_slow")
    for sock in [*greedy, extra, *silent]:
        sock.close()
    assert proc.get("/healthz") == b"ok\n"


def test_clients_that_never_read_a_large_answer_do_not_hold_the_proxy(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    """/metrics of a proxy policing 80 queues is larger than a non-reading client's socket
    buffer: within --admin-timeout the handlers are free and their descriptors closed (what
    the kernel still holds to send is no longer the proxy's; the write timeout itself is
    shown with an answer past any kernel buffer in tests/io/test_admin.py)."""
    names = [queues("adminbig") for _ in range(80)]
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name)
    prefix = names[0].rsplit("-", 1)[0]
    flow = start_flow(start_floodwall, broker, policy_file(
        tmp_path / "p.yaml", capped("many", f"{prefix}-*")),
        "--admin-max-connections", "8", "--admin-timeout", "1s")
    proc = flow.proc
    wait_for(lambda: len(proc.get("/metrics")) > 100_000, 30, what="a large /metrics")
    fds = proc.metric("process_open_fds")
    greedy = []
    for _ in range(5):
        sock = connect(proc.admin_port, rcvbuf=1024)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        greedy.append(sock)
    started = time.monotonic()
    wait_for(lambda: admin_state(proc)["connections"] == 1  # /state's own
             and proc.metric("process_open_fds") <= fds + 2, 15,  # (+2: pool churn)
             what="the greedy clients' handlers and descriptors freed")
    assert time.monotonic() - started < 8
    for sock in greedy:
        sock.close()


def test_a_login_in_the_management_url_is_refused_at_start(broker: BrokerEndpoint) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "floodwall", "run", "--upstream", broker.upstream,
         "--admin", "off", "--listen", "127.0.0.1:0", "--policies", "/dev/null",
         "--management", f"http://guest:s3cr3t@{broker.host}:{broker.management_port}"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no login in the URL" in done.stderr
    assert "FLOODWALL_MANAGEMENT_PASSWORD_FILE" in done.stderr
    assert "s3cr3t" not in done.stderr + done.stdout
