"""The live policy watcher of a real ``floodwall run``: a file that cannot be loaded (YAML
tags that do not hold, nesting past any stack, a billion laughs) is refused with its
FILE:LINE, the policies in effect stay, and a corrected file is taken at its next change,
without SIGHUP."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    capped,
    direct_params,
    policy_file,
    start_flow,
)

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

LAUGHS = "version: 1\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True))
BAD_FILES = [
    ("version: 1\npolicies:\n  - {name: a, match: {queue: q}, mode: !!bool maybe}\n",
     ":3:", "'maybe' is not a valid !!bool"),
    ("version: 1\npolicies:\n  - name: a\n    match: {queue: q}\n    capacity: !!int one\n",
     ":5:", "'one' is not a valid !!int"),
    ("version: !!timestamp x\n", ":1:", "'x' is not a valid !!timestamp"),
    ("version: 1\npolicies: " + "[" * 3000 + "]" * 3000 + "\n", ":1:", "nested too deeply"),
    (LAUGHS, ":2:", "unknown key 'a'"),
]


def replace(path: Path, text: str) -> None:
    """Write ``text`` as a new file in one step (as a ConfigMap update does)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def policies_state(flow: FlowProxy) -> dict[str, Any]:
    state = flow.proc.state()["flow"]
    assert isinstance(state, dict)
    return dict(state["policies"])


def test_the_watcher_survives_any_bad_file_and_takes_the_corrected_one(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    first, second = queues("watch-a"), queues("watch-b")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        for q in (first, second):
            ch.queue_declare(q)
    path = policy_file(tmp_path / "p.yaml", capped("a", first))
    flow = start_flow(start_floodwall, broker, path)
    wait_for(lambda: flow.queue_state(first) is not None, 15, what="the first policy")
    generation = policies_state(flow)["generation"]

    for i, (text, where, reason) in enumerate(BAD_FILES, start=1):
        replace(path, text)

        def refused(count: int = i) -> bool:
            return len(flow.log("policy_reload_failed")) >= count

        wait_for(refused, 20, what=f"bad file {i} refused ({reason})")
        line = flow.log("policy_reload_failed")[i - 1]
        assert f"{path}{where}" in line and reason in line, line
        assert "Traceback" not in line
        doc = policies_state(flow)
        assert doc["generation"] == generation and doc["entries"] == 1
        assert reason in doc["last_reload_error"]
        assert flow.queue_state(first) is not None  # the policy in effect stays

    policy_file(tmp_path / "good.yaml", capped("a", first), capped("b", second))
    replace(path, (tmp_path / "good.yaml").read_text())
    wait_for(lambda: policies_state(flow)["generation"] == generation + 1, 20,
             what="the corrected file taken without SIGHUP")
    doc = policies_state(flow)
    assert doc["entries"] == 2 and doc["last_reload_error"] is None
    wait_for(lambda: flow.queue_state(second) is not None, 15, what="the new policy applied")
    assert doc["reloads"] == {"error": len(BAD_FILES), "ok": 1}
    assert flow.log("policies_reloaded")
    assert flow.log("flow_task_failed") == []
    text = flow.proc.logfile.read_text()
    assert "Traceback" not in text
