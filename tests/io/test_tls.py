"""floodwall/io/tls.py without sockets: contexts built from files made by ``trustme``, TLS
handshakes run in memory (``ssl.MemoryBIO``), failures explained, files re-read when they
change, and the listener's context switched per handshake."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import trustme

from floodwall.io.tls import (
    ListenerTlsContext,
    ManagementTlsContext,
    UpstreamTlsContext,
    client_context,
    explain,
    listener_context,
)
from floodwall.ops.config import ListenerTls, ManagementTls, TlsVersion, UpstreamTls


def write(directory: Path, name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    found = {"ca": tmp_path / "ca.pem", "other": tmp_path / "other.pem"}
    for name, issuer, names in (("server", ca, ("localhost",)), ("client", ca, ("app",)),
                                ("rotated", other, ("localhost",))):
        found[f"{name}_cert"], found[f"{name}_key"] = write(tmp_path, name,
                                                          issuer.issue_cert(*names))
    return found


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, name: str | None = "localhost"
              ) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """A TLS handshake between two contexts in memory; raises what either side raises."""
    bios = [ssl.MemoryBIO() for _ in range(4)]
    c = client.wrap_bio(bios[0], bios[1], server_hostname=name)
    s = server.wrap_bio(bios[2], bios[3], server_side=True)
    done = {id(c): False, id(s): False}
    for _ in range(20):
        for side in (c, s):
            if not done[id(side)]:
                try:
                    side.do_handshake()
                    done[id(side)] = True
                except ssl.SSLWantReadError:
                    pass
        bios[2].write(bios[1].read())
        bios[0].write(bios[3].read())
        if all(done.values()):
            # TLS 1.3: the server judges the client's certificate after the client is done;
            # a refusal reaches the client on its next read
            try:
                c.read(1)
            except ssl.SSLWantReadError:
                pass
            return c, s
    raise AssertionError("handshake did not finish")


def served(context: ssl.SSLContext, name: str | None = "localhost") -> bytes:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c, _ = handshake(client, context, name)
    der = c.getpeercert(binary_form=True)
    assert der is not None
    return der


def leaf(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text().split("-----END CERTIFICATE-----")[0]
                                    + "-----END CERTIFICATE-----\n")


def test_upstream_context_verifies_name_and_ca(files: dict[str, Path]) -> None:
    server = listener_context(ListenerTls(files["server_cert"], files["server_key"]))
    good = client_context(UpstreamTls(ca=files["ca"]))
    assert good.minimum_version is ssl.TLSVersion.TLSv1_2
    handshake(good, server)  # verifies
    with pytest.raises(ssl.SSLCertVerificationError) as wrong_name:
        handshake(good, server, "wrong.example")
    text = explain(wrong_name.value, "wrong.example", files["ca"])
    assert text.startswith("certificate verify failed: Hostname mismatch")
    assert "verified name 'wrong.example'" in text and str(files["ca"]) in text
    with pytest.raises(ssl.SSLCertVerificationError) as wrong_ca:
        handshake(client_context(UpstreamTls(ca=files["other"])), server)
    text = explain(wrong_ca.value, "localhost", files["other"])
    assert "unable to get local issuer certificate" in text and "other.pem" in text
    insecure = client_context(UpstreamTls(insecure=True))
    handshake(insecure, server, "wrong.example")  # nothing verified
    assert client_context(UpstreamTls(min_version=TlsVersion.TLS1_3)).minimum_version is (
        ssl.TLSVersion.TLSv1_3)


def test_required_client_certificate(files: dict[str, Path]) -> None:
    server = listener_context(ListenerTls(files["server_cert"], files["server_key"],
                                          client_ca=files["ca"]))
    with_cert = client_context(UpstreamTls(ca=files["ca"], cert=files["client_cert"],
                                           key=files["client_key"]))
    _, s = handshake(with_cert, server)
    assert s.getpeercert() is not None
    with pytest.raises(ssl.SSLError) as refused:
        handshake(client_context(UpstreamTls(ca=files["ca"])), server)
    assert "presented no certificate" in explain(refused.value, None, files["ca"])
    with pytest.raises(ssl.SSLError) as other:
        handshake(client_context(UpstreamTls(ca=files["ca"], cert=files["rotated_cert"],
                                             key=files["rotated_key"])), server)
    assert "certificate" in explain(other.value, None, files["ca"])


def test_explain_plain_port_and_other_errors() -> None:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c = client.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname="mq")
    with pytest.raises(ssl.SSLWantReadError):
        c.do_handshake()
    out.read()
    bio = ssl.MemoryBIO()
    c2 = client.wrap_bio(bio, ssl.MemoryBIO(), server_hostname="mq")
    bio.write(b"AMQP\x00\x00\x09\x01" * 4)  # what a plain AMQP port answers
    with pytest.raises(ssl.SSLError) as exc:
        c2.do_handshake()
    assert "does not speak TLS" in explain(exc.value, "mq", None)
    assert explain(ConnectionResetError("reset"), "mq", None) == "reset"


def test_reloading_rebuilds_on_change_and_keeps_the_old_on_failure(
        files: dict[str, Path], tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(files["server_cert"].read_bytes())
    key.write_bytes(files["server_key"].read_bytes())
    holder = ListenerTlsContext(ListenerTls(cert, key))
    front = holder.front
    assert holder.check() is False  # nothing changed
    assert served(front) == leaf(files["server_cert"])
    # a rotation renamed into place (the kubelet's way): a new context takes over
    for src, dst in ((files["rotated_key"], key), (files["rotated_cert"], cert)):
        staged = dst.with_suffix(".new")
        staged.write_bytes(src.read_bytes())
        os.replace(staged, dst)
    assert holder.check() is True and holder.reloads == 1
    # asyncio keeps the front context; each handshake is switched to the newest one, with
    # a server name and without one
    assert served(front) == leaf(files["rotated_cert"])
    assert served(front, None) == leaf(files["rotated_cert"])
    # half a rotation (a key that does not match): logged, the last good one stays
    key.write_bytes(files["server_key"].read_bytes())
    assert holder.check() is False
    assert holder.error is not None
    assert served(front) == leaf(files["rotated_cert"])
    # the pair completes: taken
    cert.write_bytes(files["server_cert"].read_bytes())
    assert holder.check() is True and holder.error is None
    assert served(front) == leaf(files["server_cert"])


def test_upstream_and_management_holders_reload_too(files: dict[str, Path],
                                                    tmp_path: Path) -> None:
    ca = tmp_path / "bundle.pem"
    ca.write_bytes(files["other"].read_bytes())
    upstream = UpstreamTlsContext(UpstreamTls(ca=ca))
    server = listener_context(ListenerTls(files["server_cert"], files["server_key"]))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(upstream.context, server)
    ca.write_bytes(files["ca"].read_bytes() + b"\n")  # the CA bundle is replaced
    assert upstream.check()
    handshake(upstream.context, server)
    assert upstream.server_name("10.1.2.3") == "10.1.2.3"
    failure = upstream.failure(ssl.SSLError(1, "x"), "mq")
    assert isinstance(failure, ConnectionError)
    management = ManagementTlsContext(ManagementTls(ca=files["ca"]))
    handshake(management.context, server)
