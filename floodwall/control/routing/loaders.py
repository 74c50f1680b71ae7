"""The management API's documents read into the routing model (a full listing, one exchange)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from decimal import Decimal

from floodwall.control.routing.model import (
    Binding,
    Destination,
    DestinationKind,
    Exchange,
    TopologyError,
    _Policy,
)
from floodwall.control.routing.terms import _timestamp
from floodwall.control.routing.vhost import _VirtualHost
from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange


def _read_policy(item: Mapping[str, object], where: str) -> _Policy:
    name = _text(item, "name", where)
    definition = item.get("definition")
    if not isinstance(definition, Mapping):
        raise TopologyError(f"{where}: definition is not an object")
    try:
        pattern: re.Pattern[str] | None = re.compile(_text(item, "pattern", where))
    except re.error:
        pattern = None
    priority = item.get("priority", 0)
    ae = definition.get("alternate-exchange")
    return _Policy(
        name=name,
        pattern=pattern,
        applies_to_exchanges=item.get("apply-to", "all") in ("exchanges", "all"),
        priority=float(priority) if isinstance(priority, int | float) else 0.0,
        alternate_exchange=ae if isinstance(ae, str) else None,
    )


def _text(item: Mapping[str, object], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise TopologyError(f"{where}: {key!r} is missing or not a string")
    return value


def _flag(item: Mapping[str, object], key: str, default: bool, where: str) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise TopologyError(f"{where}: {key!r} is not a boolean")
    return value


def _json_arguments(item: Mapping[str, object], where: str) -> dict[str, object]:
    value = item.get("arguments")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TopologyError(f"{where}: arguments is not an object")
    return {str(k): _from_json(v) for k, v in value.items()}


def _from_json(value: object) -> object:
    """A management API field value; ``"undefined"`` is how the API renders void."""
    if value == "undefined":
        return None
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _from_json(v) for k, v in value.items()}
    return value


def _listed_form(value: object) -> object:
    """A binding argument as the management API lists it (a decimal as a float, a timestamp
    as its integer, bytes as text), hashable: how two sources' bindings are compared."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _listed_form(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", *(_listed_form(v) for v in value))
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return _timestamp(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode(errors="replace")
    return value


def _items(document: object, what: str) -> Iterator[tuple[str, Mapping[str, object]]]:
    if not isinstance(document, list):
        raise TopologyError(f"{what}: expected a JSON array, got {type(document).__name__}")
    for i, item in enumerate(document):
        where = f"{what}[{i}]"
        if not isinstance(item, Mapping):
            raise TopologyError(f"{where}: expected an object")
        yield where, item


def exchange_changes(exchange: object, bindings: object) -> list[TopologyChange]:
    """The changes one exchange's management API documents mean: its declaration
    (``/api/exchanges/{vhost}/{name}``) and its bindings as source
    (``.../bindings/source``). Raises TopologyError for a malformed document."""
    if not isinstance(exchange, Mapping):
        raise TopologyError("exchange: expected an object")
    where = "exchange"
    vhost = _text(exchange, "vhost", where)
    name = _text(exchange, "name", where)
    changes = [TopologyChange(
        ChangeKind.DECLARE_EXCHANGE, vhost, name,
        arguments=_json_arguments(exchange, where),
        exchange_type=_text(exchange, "type", where),
        durable=_flag(exchange, "durable", True, where),
        auto_delete=_flag(exchange, "auto_delete", False, where),
        internal=_flag(exchange, "internal", False, where))]
    for at, item in _items(bindings, "bindings"):
        source = _text(item, "source", at)
        if source == "":
            continue
        kind = _text(item, "destination_type", at)
        if kind not in ("queue", "exchange"):
            raise TopologyError(f"{at}: unknown destination_type")
        changes.append(TopologyChange(
            ChangeKind.BIND_QUEUE if kind == "queue" else ChangeKind.BIND_EXCHANGE,
            _text(item, "vhost", at), _text(item, "destination", at), source,
            _text(item, "routing_key", at), _json_arguments(item, at)))
    return changes


def read_management(exchanges: object, queues: object, bindings: object,
                    policies: object | None = None, *, vhost: str | None = None
                    ) -> dict[str, _VirtualHost]:
    """The virtual hosts the management API's documents describe (``Topology.load_management``
    says which). Raises TopologyError for a malformed document."""
    loaded: dict[str, _VirtualHost] = {}

    def target(where: str, item: Mapping[str, object]) -> _VirtualHost | None:
        name = _text(item, "vhost", where)
        if vhost is not None and name != vhost:
            return None
        v = loaded.get(name)
        if v is None:
            v = loaded[name] = _VirtualHost(name)
        return v

    policy_ae = _read_policies(policies if policies is not None else [], target)
    _read_exchanges(exchanges, target, policy_ae)
    for where, item in _items(queues, "queues"):
        v = target(where, item)
        if v is not None:
            name = _text(item, "name", where)
            v.queues.add(name)
            queue_type = QueueType.of(item.get("type"))
            if queue_type is not QueueType.CLASSIC:
                v.queue_types[name] = queue_type
    _read_bindings(bindings, target)
    return loaded


_Target = Callable[[str, Mapping[str, object]], "_VirtualHost | None"]


def _read_policies(policies: object, target: _Target) -> dict[tuple[str, str], str | None]:
    """Each vhost's policies; returns the alternate exchange each (vhost, policy) sets."""
    policy_ae: dict[tuple[str, str], str | None] = {}
    for where, item in _items(policies, "policies"):
        v = target(where, item)
        policy = _read_policy(item, where)
        if v is not None:
            v.policies.append(policy)
            policy_ae[(v.name, policy.name)] = policy.alternate_exchange
    return policy_ae


def _read_exchanges(exchanges: object, target: _Target,
                    policy_ae: dict[tuple[str, str], str | None]) -> None:
    for where, item in _items(exchanges, "exchanges"):
        v = target(where, item)
        if v is None:
            continue
        name = _text(item, "name", where)
        policy_name = item.get("policy")
        v.exchanges[name] = Exchange(
            v.name, name, _text(item, "type", where),
            durable=_flag(item, "durable", True, where),
            auto_delete=_flag(item, "auto_delete", False, where),
            internal=_flag(item, "internal", False, where),
            arguments=_json_arguments(item, where),
            policy_alternate_exchange=(policy_ae.get((v.name, policy_name))
                                       if isinstance(policy_name, str) else None),
        )


def _read_bindings(bindings: object, target: _Target) -> None:
    for where, item in _items(bindings, "bindings"):
        v = target(where, item)
        if v is None:
            continue
        source = _text(item, "source", where)
        if source == "":
            continue  # the default exchange's implicit bindings
        try:
            kind = DestinationKind(_text(item, "destination_type", where))
        except ValueError as exc:
            raise TopologyError(f"{where}: unknown destination_type") from exc
        v.add_binding(Binding(
            v.name, source, Destination(kind, _text(item, "destination", where)),
            _text(item, "routing_key", where), _json_arguments(item, where)))
