"""The management API client: pooled keep-alive connections on the event loop, timeouts,
https verified against a CA file, every failure turned into one ``ManagementError`` kind.

The good paths run against the real RabbitMQ's management API; the failures a broker
cannot be made to produce on demand (a server that never answers, a reply that is not
JSON, a server that closes each connection after one answer) against a few lines of
HTTP served here.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trustme

from floodwall.control.depth import ManagementSample
from floodwall.dev.devbroker import BrokerEndpoint, free_port
from floodwall.io.management import (
    ManagementApi,
    ManagementError,
    api_path,
    endpoint_of,
    path_segment,
)
from floodwall.io.tls import ManagementTlsContext
from floodwall.ops.config import ManagementCredentials, ManagementTls
from tests.conftest import run, wait_for

pika = pytest.importorskip("pika")

Reply = Callable[[bytes], Awaitable[bytes | None]]  # request head -> response (None: hang)


def api_for(ep: BrokerEndpoint, **kwargs: object) -> ManagementApi:
    return ManagementApi(ep.management_url, ManagementCredentials(ep.username, ep.password),
                         **kwargs)  # type: ignore[arg-type]


def json_reply(body: bytes = b"[]", status: str = "200 OK", close: bool = False
               ) -> Reply:
    async def reply(_head: bytes) -> bytes:
        headers = [f"HTTP/1.1 {status}", "Content-Type: application/json",
                   f"Content-Length: {len(body)}"]
        if close:
            headers.append("Connection: close")
        return ("\r\n".join(headers) + "\r\n\r\n").encode() + body
    return reply


class HttpServer:
    """A few lines of HTTP/1.1 on 127.0.0.1: counts connections and requests; ``reply``
    makes each response; ``one_per_connection`` closes after each answer without saying
    so (as a server past its keep-alive limit does)."""

    def __init__(self, reply: Reply, tls: ssl.SSLContext | None = None,
                 one_per_connection: bool = False) -> None:
        self.reply = reply
        self.tls = tls
        self.one_per_connection = one_per_connection
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> HttpServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                response = await self.reply(head)
                if response is None:
                    await asyncio.sleep(3600)  # never answer
                    return
                writer.write(response)
                await writer.drain()
                if self.one_per_connection or b"Connection: close" in response:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def test_endpoint_labels() -> None:
    assert endpoint_of("/api/queues/%2F/orders?columns=name") == "queues"
    assert endpoint_of("/api/nodes?columns=name,mem_alarm") == "nodes"
    assert endpoint_of("/api/exchanges/%2F/x/bindings/source") == "exchanges"
    assert endpoint_of("/api/overview") == "other"


HOSTILE_QUEUES = [".", "..", "...", "a/b", "../x", "%2E%2E", "sp ace", "é", "q?x#y"]


def test_names_are_one_segment_each_and_dots_are_never_dot_segments() -> None:
    assert path_segment("..") == "%2E%2E" and path_segment(".") == "%2E"
    assert path_segment("/") == "%2F" and path_segment("a.b") == "a.b"
    assert path_segment("%2E") == "%252E"
    assert api_path("queues", "/", "..", query="columns=name") == \
        "/api/queues/%2F/%2E%2E?columns=name"
    for name in HOSTILE_QUEUES:
        segment = path_segment(name)
        assert "/" not in segment and "?" not in segment and "#" not in segment
        assert segment.strip(".") != ""


def test_the_path_is_sent_as_built_not_normalised() -> None:
    """yarl decodes and normalises a plain string (``/api/queues/%2F/..`` becomes
    ``/api/queues/``): the request line must carry the encoded segments. A dot-only name,
    which RabbitMQ's router would drop all the same, is asked of the filtered listing."""
    heads: list[bytes] = []

    async def record(head: bytes) -> bytes:
        heads.append(head)
        listing = b"page=" in head.split(b"\r\n", 1)[0]
        return await json_reply(b'{"items": [], "page_count": 1}' if listing else b"{}")(head)

    async def body() -> None:
        async with HttpServer(record) as server:
            api = ManagementApi(server.url + "/prefix/", ManagementCredentials())
            for name in HOSTILE_QUEUES:
                await api.queue_sample("/", name)
            assert await api.queue_sample("..", "q") is None
            await api.close()

    run(body)
    lines = [h.split(b"\r\n", 1)[0].decode() for h in heads]
    for name, line in zip(HOSTILE_QUEUES, lines, strict=False):
        if name.strip(".") == "":
            pattern = "%5E" + "%5C." * len(name) + "%24"
            assert line.startswith("GET /prefix/api/queues/%2F?page=1&page_size=500"
                                   f"&use_regex=true&name={pattern}&columns="), line
        else:
            assert line.startswith(
                f"GET /prefix/api/queues/%2F/{path_segment(name)}?columns="), line
    assert lines[-1].startswith("GET /prefix/api/queues?page=1&page_size=500&use_regex=true"
                                "&name=%5Eq%24&columns="), lines[-1]


# --- against the real broker ------------------------------------------------------------

@pytest.mark.broker
def test_a_dot_only_queue_name_reads_that_queue(broker: BrokerEndpoint) -> None:
    """Queues named ``.``, ``..`` and the like each read as themselves (``..`` once read as
    the list of every queue: a bad reply that marked every policed queue's depth unknown)."""
    tag = uuid.uuid4().hex[:6]
    names = [".", "..", "...", f"a/{tag}", f"../{tag}", f"%2E%2E{tag}", f"sp ace {tag}"]
    with pika.BlockingConnection(pika.ConnectionParameters(
            broker.host, broker.amqp_port, credentials=pika.PlainCredentials(
                broker.username, broker.password))) as conn:
        ch = conn.channel()
        for i, name in enumerate(names):
            ch.queue_declare(name)
            ch.queue_purge(name)
            for _ in range(i + 1):
                ch.basic_publish("", name, b"x" * 10)
        samples: dict[str, object] = {}

        async def sample_all() -> None:
            api = api_for(broker)
            try:
                for name in names:
                    samples[name] = await api.queue_sample("/", name)
                assert api.failures == {}
            finally:
                await api.close()

        def all_counted() -> bool:
            run(sample_all)
            return all(isinstance(s, ManagementSample) and s.messages_ready == i + 1
                       for i, s in enumerate(samples.values()))

        ch.exchange_declare("..", "fanout")
        ch.queue_bind("..", "..")

        async def exchange() -> None:
            api = api_for(broker)
            try:
                doc = await api.item("exchanges", "/", "..")
                assert doc["name"] == ".." and doc["type"] == "fanout"
                bindings = await api.bindings_from("/", "..")
                assert [(b["source"], b["destination"]) for b in bindings] == [("..", "..")]
                assert await api.item("exchanges", "/", "...") is None
            finally:
                await api.close()

        try:
            wait_for(all_counted, 30, what=f"each queue's own figures: {samples}")
            run(exchange)
        finally:
            ch.exchange_delete("..")
            for name in names:
                ch.queue_delete(name)


@pytest.mark.broker
def test_requests_share_one_pooled_connection(broker: BrokerEndpoint) -> None:
    """Sequential requests reuse one keep-alive connection; a burst of concurrent ones
    opens no more than the pool's size; every request's latency is observed by endpoint."""
    queue = f"mgmt-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.ConnectionParameters(
            broker.host, broker.amqp_port, credentials=pika.PlainCredentials(
                broker.username, broker.password))) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, auto_delete=False)
        ch.basic_publish("", queue, b"x" * 100)
        observed: list[tuple[str, float]] = []
        # a queue has no figures until the broker's first statistics emission
        wait_for(lambda: "messages_ready" in broker.api(  # type: ignore[operator]
            "GET", f"/api/queues/%2F/{queue}"), 15, what="the queue's statistics")

        async def body() -> None:
            api = api_for(broker, connections=3,
                          observe=lambda e, s: observed.append((e, s)))
            try:
                for _ in range(5):
                    sample = await api.queue_sample("/", queue)
                    assert isinstance(sample, ManagementSample)
                alarms = await api.alarms()
                assert not alarms.any
                assert await api.queue_sample("/", queue + "-none") is None  # 404
                assert api.opened == 1, "sequential requests must reuse one connection"
                results = await asyncio.gather(*(api.get("/api/overview")
                                                 for _ in range(12)))
                assert all(isinstance(r, dict) for r in results)
                assert 1 < api.opened <= 3, api.opened
                assert api.requests == 19
                assert api.failures == {"not_found": 1}
            finally:
                await api.close()

        run(body)
        ch.queue_delete(queue)
    assert [e for e, _ in observed].count("queues") == 6
    assert [e for e, _ in observed].count("nodes") == 1
    assert [e for e, _ in observed].count("other") == 12
    assert all(s >= 0 for _, s in observed)


@pytest.mark.broker
def test_wrong_password_is_auth(broker: BrokerEndpoint) -> None:
    async def body() -> None:
        api = ManagementApi(broker.management_url,
                            ManagementCredentials(broker.username, "wrong"))
        try:
            with pytest.raises(ManagementError) as caught:
                await api.alarms()
            assert caught.value.kind == "auth" and caught.value.status == 401
        finally:
            await api.close()

    run(body)


# --- failures served here ---------------------------------------------------------------

def test_nothing_listening_is_unreachable() -> None:
    async def body() -> None:
        api = ManagementApi(f"http://127.0.0.1:{free_port()}", ManagementCredentials())
        with pytest.raises(ManagementError) as caught:
            await api.get("/api/nodes")
        assert caught.value.kind == "unreachable"
        await api.close()

    run(body)


def test_a_server_that_never_answers_is_a_timeout() -> None:
    async def hang(_head: bytes) -> None:
        return None

    async def body() -> None:
        async with HttpServer(hang) as server:
            api = ManagementApi(server.url, ManagementCredentials(), timeout=0.3)
            with pytest.raises(ManagementError) as caught:
                await api.get("/api/nodes")
            assert caught.value.kind == "timeout"
            assert "no answer in 0.3s" in str(caught.value)
            await api.close()

    run(body)


@pytest.mark.parametrize(("reply", "kind"), [
    (json_reply(b"<html>oops</html>"), "bad_reply"),
    (json_reply(b"{}", "503 Service Unavailable"), "http"),
    (json_reply(b"{}", "404 Not Found"), "not_found"),
    (json_reply(b"{}", "401 Unauthorized"), "auth"),
])
def test_replies_become_kinds(reply: Reply, kind: str) -> None:
    async def body() -> None:
        async with HttpServer(reply) as server:
            api = ManagementApi(server.url, ManagementCredentials())
            with pytest.raises(ManagementError) as caught:
                await api.get("/api/nodes")
            assert caught.value.kind == kind
            await api.close()

    run(body)


def test_credentials_are_sent_as_basic_auth() -> None:
    heads: list[bytes] = []
    ok = json_reply(b"[]")

    async def record(head: bytes) -> bytes | None:
        heads.append(head)
        return await ok(head)

    async def body() -> None:
        async with HttpServer(record) as server:
            api = ManagementApi(server.url, ManagementCredentials("floodwall", "s3cret"))
            assert await api.get("/api/nodes") == []
            await api.close()

    run(body)
    # base64("floodwall:s3cret")
    assert b"Authorization: Basic Zmxvb2R3YWxsOnMzY3JldA==" in heads[0]


def test_a_server_closing_after_each_answer_costs_no_failure() -> None:
    """RabbitMQ's HTTP server closes a keep-alive connection after its request limit; a
    pooled connection found closed is retried on a new one, not reported as a failure."""
    async def body() -> None:
        async with HttpServer(json_reply(b"[]"), one_per_connection=True) as server:
            api = ManagementApi(server.url, ManagementCredentials())
            for _ in range(5):
                assert await api.get("/api/nodes") == []
                await asyncio.sleep(0.01)  # let the close arrive
            assert api.failures == {}
            assert server.requests >= 5 and server.connections >= 5
            await api.close()

    run(body)


def test_keep_alive_is_used_when_the_server_allows_it() -> None:
    async def body() -> None:
        async with HttpServer(json_reply(b"{}")) as server:
            api = ManagementApi(server.url, ManagementCredentials())
            for _ in range(10):
                assert await api.get("/api/overview") == {}
            assert (server.connections, server.requests) == (1, 10)
            await api.close()

    run(body)


# --- https with a CA file ---------------------------------------------------------------

@pytest.fixture(scope="module")
def https_pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path, Path]:
    """A server context for 127.0.0.1 and the CA file that verifies it, and another CA."""
    ca, other = trustme.CA(), trustme.CA()
    directory = tmp_path_factory.mktemp("mgmt-pki")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    ca_file, other_file = directory / "ca.pem", directory / "other.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    other.cert_pem.write_to_path(str(other_file))
    return server, ca_file, other_file


def test_https_verified_against_the_ca_file(https_pki: tuple[ssl.SSLContext, Path, Path]
                                            ) -> None:
    server_context, ca_file, _ = https_pki

    async def body() -> None:
        async with HttpServer(json_reply(b'[{"name": "rabbit@a"}]'),
                              tls=server_context) as server:
            tls = ManagementTlsContext(ManagementTls(ca=ca_file))
            api = ManagementApi(server.url, ManagementCredentials(), tls=tls)
            alarms = await api.alarms()
            assert not alarms.any
            await api.get("/api/nodes")
            assert api.opened == 1
            await api.close()

    run(body)


def test_https_with_another_ca_is_a_tls_failure(https_pki: tuple[ssl.SSLContext, Path, Path]
                                                ) -> None:
    server_context, _, other_file = https_pki

    async def body() -> None:
        async with HttpServer(json_reply(b"[]"), tls=server_context) as server:
            tls = ManagementTlsContext(ManagementTls(ca=other_file))
            api = ManagementApi(server.url, ManagementCredentials(), tls=tls)
            with pytest.raises(ManagementError) as caught:
                await api.get("/api/nodes")
            assert caught.value.kind == "tls"
            assert "certificate verify failed" in str(caught.value)
            assert str(other_file) in str(caught.value)
            await api.close()

    run(body)
