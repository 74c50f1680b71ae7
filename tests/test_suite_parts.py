"""How `make test` splits the suite: the parts ``--part`` selects, and the port stripes that let
two of them start brokers side by side."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from floodwall.dev import devbroker
from floodwall.dev.devbroker import PORT_STRIPE_ENV, BrokerError, free_port, port_range

ROOT = Path(__file__).resolve().parents[1]
#: A sample of the suite: a load-tolerant module with a timed test in it, one of each kind
#: from deploy/, and a standalone module.
SAMPLE = ("tests/clients/test_clients_direct.py", "tests/deploy/test_pod.py",
          "tests/deploy/test_chart.py", "tests/test_suite_parts.py")


def collected(part: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
         "--part", part, *SAMPLE], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_services_part_is_its_timed_and_load_tolerant_tests_and_nothing_twice() -> None:
    timed, tolerant = collected("services-timed"), collected("services-tolerant")
    assert timed and tolerant and not timed & tolerant
    assert timed | tolerant == collected("services")
    assert all(t.startswith(("tests/deploy/test_chart.py", "tests/clients/")) for t in tolerant)
    # a module's marker, and a test's own load_tolerant(False) before it
    assert any(t.startswith("tests/deploy/test_pod.py") for t in timed)
    assert any("test_producers_keep_to_their_rate" in t for t in timed)
    assert not any("test_producers_keep_to_their_rate" in t for t in tolerant)
    assert any("test_platform_clients_startok" in t for t in tolerant)
    assert collected("standalone") == {t for t in collected("standalone")
                                       if t.startswith("tests/test_suite_parts.py")}


@pytest.mark.parametrize("stripe, remainder", [("0/2", 0), ("1/2", 1), ("2/3", 2)])
def test_free_ports_keep_to_the_stripe(monkeypatch: pytest.MonkeyPatch, stripe: str,
                                       remainder: int) -> None:
    monkeypatch.setenv(PORT_STRIPE_ENV, stripe)
    n = int(stripe.split("/")[1])
    assert all(free_port() % n == remainder for _ in range(20))


def test_free_ports_are_below_the_kernels_ephemeral_ones_and_never_handed_out_twice() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert all(p in port_range() and 1024 < p < low for p in ports)
    assert len(set(ports)) == len(ports)


def test_a_port_something_listens_on_is_never_handed_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = free_port()
    three = range(first, first + 3)
    monkeypatch.setattr(devbroker, "port_range", lambda: three)
    monkeypatch.setattr(devbroker, "_handed_out", set())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        got = {free_port(), free_port()}
        assert got == {first + 1, first + 2}
        with pytest.raises(BrokerError, match="no free port"):
            free_port()  # the listened one is the only one left


@pytest.mark.parametrize("stripe", ["1", "2/2", "x/2", "-1/2"])
def test_a_malformed_stripe_is_refused(monkeypatch: pytest.MonkeyPatch, stripe: str) -> None:
    monkeypatch.setenv(PORT_STRIPE_ENV, stripe)
    with pytest.raises(BrokerError, match=PORT_STRIPE_ENV):
        free_port()
