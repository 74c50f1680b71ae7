"""The explicit read schema of telemetry versions 1 to 3 (docs/telemetry.md): a StructType.

One struct for the three record types (``sample``, ``sidecar``, ``event``): a field a type does
not carry reads as null. ``TELEMETRY_SCHEMA`` is every field any version writes (version 2:
version 1 without ``V1_ONLY``, none of them read here; version 3: version 2 without nulls and
zero counts, which pipeline/load.py reads as 0: so one schema reads all three); the job reads
with ``READ_SCHEMA``, the fields it uses (about half): the JSON parser then skips the others
without converting them, which is most of the cost of reading. A line that is not JSON, or
whose value in a field the job reads does not fit its type, lands whole in
``_corrupt_record`` (Spark's PERMISSIVE mode) and is counted, never fatal; the job reads
with ``STRICT_SCHEMA`` first, the same fields without that column, and only if a line is
malformed with ``READ_SCHEMA`` (pipeline/load.py, ``load``).
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from floodwall.ops.telemetry import SCHEMA_VERSION

CORRUPT = "_corrupt_record"
#: Version 2 is version 1 without fields this reader never read, version 3 version 2 sparse
#: (docs/telemetry.md).
SUPPORTED_VERSIONS = (1, 2, SCHEMA_VERSION)

_FIELDS: list[tuple[str, DataType]] = [
    # every record
    ("v", LongType()), ("type", StringType()), ("ts", DoubleType()), ("mono", DoubleType()),
    ("seq", LongType()), ("sidecar", StringType()), ("vhost", StringType()),
    ("queue", StringType()),
    # sample (and some sidecar) fields
    ("interval", DoubleType()), ("policy", StringType()), ("capacity", LongType()),
    ("resume", LongType()), ("max_messages", LongType()), ("resume_messages", LongType()),
    ("overflow", StringType()), ("deadline", DoubleType()), ("mode", StringType()),
    ("depth_bytes", LongType()), ("depth_messages", LongType()),
    ("broker_depth_bytes", LongType()), ("broker_depth_messages", LongType()),
    ("ready_count", LongType()), ("depth_known", BooleanType()),
    ("ingress_bytes", LongType()), ("ingress_messages", LongType()),
    ("delivered_messages", LongType()),
    ("tripped", BooleanType()), ("trips", LongType()), ("tripped_seconds", DoubleType()),
    ("blocked_publishers", LongType()), ("held_bytes", LongType()),
    ("held_messages", LongType()), ("spooled_bytes", LongType()),
    ("sampling_interval", DoubleType()), ("drain_bytes_per_second", DoubleType()),
    # sample: the fleet (absent with --fleet off)
    ("fleet_members", LongType()), ("fleet_share_bytes", LongType()),
    ("fleet_demand_bytes_per_s", DoubleType()),
    # sample: the AMQP 1.0 sender links whose credit the proxy caps (absent: none)
    ("amqp10_links", LongType()), ("amqp10_window_bytes", LongType()),
    ("amqp10_credit", LongType()), ("amqp10_admitted_credit", LongType()),
    # sidecar
    ("policed_queues", LongType()), ("tripped_queues", LongType()),
    ("blocked_channels", LongType()), ("alarm", StringType()),
    ("flow_off_total", LongType()), ("flow_on_total", LongType()),
    ("rejects_total", LongType()), ("deadline_expiries_total", LongType()),
    ("dropped_records", LongType()),
    # event
    ("event", StringType()), ("reason", StringType()), ("conn", LongType()),
    ("channel", LongType()), ("active", BooleanType()), ("body_bytes", LongType()),
    ("waited", DoubleType()), ("answer", StringType()), ("action", StringType()),
    # event: broker_rejected (the broker's rejected outcomes for a 1.0 sender)
    ("count", LongType()), ("condition", StringType()),
    # event: replay (a spool's replay session)
    ("replayed", LongType()), ("replayed_bytes", LongType()), ("seconds", DoubleType()),
    ("records_left", LongType()), ("bytes_left", LongType()),
]

#: Telemetry as read: every field nullable, plus the corrupt-record column.
TELEMETRY_SCHEMA = StructType(
    [StructField(name, typ, True) for name, typ in _FIELDS]
    + [StructField(CORRUPT, StringType(), True)])
FIELD_NAMES = [name for name, _ in _FIELDS]

#: The fields the job uses (pipeline/load.py, pipeline/aggregate.py).
READ_FIELDS = (
    "v", "type", "ts", "seq", "sidecar", "vhost", "queue",
    "interval", "policy", "capacity", "resume", "max_messages", "resume_messages",
    "overflow", "deadline", "mode", "depth_bytes", "depth_messages", "broker_depth_bytes",
    "broker_depth_messages", "ingress_bytes", "ingress_messages", "tripped", "trips",
    "blocked_publishers", "held_bytes", "held_messages", "spooled_bytes",
    "drain_bytes_per_second", "fleet_members", "fleet_share_bytes", "fleet_demand_bytes_per_s",
    "blocked_channels", "alarm", "dropped_records", "event",
)
#: The fields the job reads, without the corrupt-record column: the first, strict read
#: (pipeline/load.py, ``load``).
STRICT_SCHEMA = StructType(
    [StructField(name, typ, True) for name, typ in _FIELDS if name in READ_FIELDS])
#: The same with the corrupt-record column: the read with an account of each bad line.
READ_SCHEMA = StructType([*STRICT_SCHEMA.fields, StructField(CORRUPT, StringType(), True)])
