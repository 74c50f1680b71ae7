"""Declares, deletes and binds a 0-9-1 client makes, applied once the broker said -ok.

The routing model follows what clients do through the proxy as soon as the broker confirms
it (the broker's event stream says the same a moment later, for every client). A request is
remembered per channel and applied when its -ok comes back on that channel (requests with
``nowait`` at once); a refused request (the broker closes the channel) is forgotten with the
channel.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any, Final

from pamqp import commands

from floodwall.wire.amqp091.framing import Buffer, decode_method
from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange

__all__ = ["REPLY_KEYS", "REQUEST_KEYS", "TopologyChange", "TopologyWatch"]

_Q = commands.Queue
_X = commands.Exchange


# request method index -> (its -ok index, how to read the request)
_REQUESTS: Final = {
    _Q.Declare.index: _Q.DeclareOk.index,
    _Q.Delete.index: _Q.DeleteOk.index,
    _Q.Bind.index: _Q.BindOk.index,
    _Q.Unbind.index: _Q.UnbindOk.index,
    _X.Declare.index: _X.DeclareOk.index,
    _X.Delete.index: _X.DeleteOk.index,
    _X.Bind.index: _X.BindOk.index,
    _X.Unbind.index: _X.UnbindOk.index,
}
REQUEST_KEYS: Final = frozenset(_REQUESTS)
REPLY_KEYS: Final = frozenset(_REQUESTS.values())


def _change(key: int, m: Any, vhost: str) -> TopologyChange:
    args = dict(getattr(m, "arguments", None) or {})
    if key == _Q.Declare.index:
        return TopologyChange(ChangeKind.DECLARE_QUEUE, vhost, m.queue,
                              queue_type=QueueType.of(args.get("x-queue-type")))
    if key == _Q.Delete.index:
        return TopologyChange(ChangeKind.DELETE_QUEUE, vhost, m.queue)
    if key in (_Q.Bind.index, _Q.Unbind.index):
        kind = ChangeKind.BIND_QUEUE if key == _Q.Bind.index else ChangeKind.UNBIND_QUEUE
        return TopologyChange(kind, vhost, m.queue, m.exchange, m.routing_key or "", args)
    if key == _X.Declare.index:
        return TopologyChange(
            ChangeKind.DECLARE_EXCHANGE,
            vhost,
            m.exchange,
            arguments=args,
            exchange_type=m.exchange_type,
            durable=bool(m.durable),
            auto_delete=bool(m.auto_delete),
            internal=bool(m.internal),
        )
    if key == _X.Delete.index:
        return TopologyChange(ChangeKind.DELETE_EXCHANGE, vhost, m.exchange)
    kind = ChangeKind.BIND_EXCHANGE if key == _X.Bind.index else ChangeKind.UNBIND_EXCHANGE
    return TopologyChange(kind, vhost, m.destination, m.source, m.routing_key or "", args)


_CLASSES: Final = {
    c.index: c
    for c in (_Q.Declare, _Q.Delete, _Q.Bind, _Q.Unbind, _X.Declare, _X.Delete, _X.Bind, _X.Unbind)
}


class TopologyWatch:
    """Pending topology requests per channel; ``request`` and ``reply`` return the change
    the broker has confirmed, if any (a request with ``nowait`` at once)."""

    def __init__(self) -> None:
        self.vhost = "/"
        self._pending: dict[int, deque[tuple[int, TopologyChange]]] = {}
        self._last_queue: dict[int, str] = {}  # the channel's last declared queue

    def request(self, key: int, channel: int, buf: Buffer, offset: int, base: int
                ) -> TopologyChange | None:
        method = decode_method(buf, offset, _CLASSES[key], base)
        if getattr(method, "passive", False) and key == _X.Declare.index:
            return None  # a passive exchange declare changes nothing
        change = _change(key, method, self.vhost)
        if change.name == "" and change.kind in (ChangeKind.BIND_QUEUE, ChangeKind.UNBIND_QUEUE,
                                                 ChangeKind.DELETE_QUEUE):
            # RabbitMQ reads an empty queue name as the channel's last declared queue, and
            # an empty binding key along with it as that queue's name.
            last = self._last_queue.get(channel, "")
            key_default = change.routing_key or (
                last if change.kind is not ChangeKind.DELETE_QUEUE else "")
            change = replace(change, name=last, routing_key=key_default)
        if getattr(method, "nowait", False):
            return change
        self._pending.setdefault(channel, deque()).append((_REQUESTS[key], change))
        return None

    def reply(self, key: int, channel: int, buf: Buffer, offset: int, base: int
              ) -> TopologyChange | None:
        pending = self._pending.get(channel)
        if not pending or pending[0][0] != key:
            return None
        _, change = pending.popleft()
        if key == _Q.DeclareOk.index:  # the broker names server-named queues
            ok = decode_method(buf, offset, _Q.DeclareOk, base)
            change = replace(change, name=ok.queue or change.name,
                             message_count=ok.message_count)
            self._last_queue[channel] = change.name
        return change

    def channel_gone(self, channel: int) -> None:
        self._pending.pop(channel, None)
        self._last_queue.pop(channel, None)
