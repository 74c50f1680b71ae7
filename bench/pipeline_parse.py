"""What reading the telemetry costs, scan by scan: CPU seconds of one
``local[1]`` JVM.

    .venv/bin/python -m bench.pipeline_parse                    # writes the telemetry first
    .venv/bin/python -m bench.pipeline_parse --data DIR --scans text,reader

The telemetry is the pipeline benchmark's (bench/pipeline_bench.py: 64 sidecars x 1 h
feeding 4 queues, seed 64) in schema version 1 (the scans below are defined on its lines)
unless ``--data`` names a directory of it. Each scan runs twice
in one warm SparkSession (the job's own settings, pipeline/analyze.py); the second is
reported. Every column a scan yields is converted: the scan ends in an aggregate over a
hash of them all (a ``count()`` would let Spark skip the parsing). Scans:

- ``text``: the lines alone (read and split), the floor of any parser;
- ``reader``: the job's JSON reader, ``READ_SCHEMA`` (36 fields, 27 of them on a sample
  line) in PERMISSIVE mode with the corrupt-record column (pipeline/load.py);
- ``reader5``: the same reader with 5 fields;
- ``slim``: the job's reader on the same records written without the 12 fields no reader
  uses (``UNREAD``): what a leaner wire format would save (telemetry version 2 leaves out
  the same fields but ``sampling_interval``, which the synthetic records do not carry, and
  writes ``depth_known`` only when false);
- ``template``: the lines as text, checked against the generator's key order of a sample
  record (one regular expression per line: each value a JSON number, string or literal),
  split at commas, the fields cast from their text: the parse without a JSON parser,
  in Spark SQL (no UDF: executors need no floodwall code).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from floodwall_pipeline.analyze import spark_session
from floodwall_pipeline.load import FILE_GLOB
from floodwall_pipeline.schema import _FIELDS, CORRUPT, READ_FIELDS, READ_SCHEMA

SCANS = ("text", "reader", "reader5", "slim", "template")
#: Fields the proxy (or the generator) writes and nothing reads (pipeline/schema.py).
UNREAD = ("mono", "ready_count", "depth_known", "delivered_messages", "tripped_seconds",
          "sampling_interval", "policed_queues", "tripped_queues", "flow_off_total",
          "flow_on_total", "rejects_total", "deadline_expiries_total")
#: A sample record's keys in the order pipeline/synthetic.py writes them.
SAMPLE_KEYS = (
    "v", "type", "ts", "mono", "seq", "sidecar", "vhost", "queue", "interval", "policy",
    "capacity", "resume", "max_messages", "resume_messages", "overflow", "deadline",
    "depth_bytes", "depth_messages", "broker_depth_bytes", "broker_depth_messages",
    "ready_count", "depth_known", "ingress_bytes", "ingress_messages", "delivered_messages",
    "tripped", "trips", "tripped_seconds", "blocked_publishers", "held_bytes",
    "held_messages", "spooled_bytes")
_VALUE = {"bigint": r"-?(?:0|[1-9][0-9]{0,17})",
          "double": r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?",
          "string": r'"[ !#-+\--\[\]-~]*"',  # printable ASCII but '"', '\' and ','
          "boolean": r"(?:true|false)"}


def _jvm_cpu(spark: SparkSession) -> float:
    gateway = spark.sparkContext._gateway
    assert gateway is not None and gateway.proc is not None
    fields = Path(f"/proc/{gateway.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reader(spark: SparkSession, data: str, schema: StructType) -> DataFrame:
    return (spark.read.schema(schema).option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .option("recursiveFileLookup", "true").option("pathGlobFilter", FILE_GLOB)
            .json(data))


def _text(spark: SparkSession, data: str) -> DataFrame:
    return (spark.read.option("recursiveFileLookup", "true")
            .option("pathGlobFilter", FILE_GLOB).text(data))


def template_pattern() -> str:
    types = dict(_FIELDS)
    return (r"^\{" + ",".join(f'"{k}":(?:{_VALUE[types[k].simpleString()]}|null)'
                              for k in SAMPLE_KEYS) + r"\}$")


def _template(spark: SparkSession, data: str) -> DataFrame:
    types = dict(_FIELDS)
    ok = F.col("value").rlike(template_pattern())
    parts = F.when(ok, F.split(F.expr("substring(value, 2, length(value) - 2)"), ",", -1))
    lines = _text(spark, data).select(parts.alias("a"))
    cols: list[Column] = []
    for i, key in enumerate(SAMPLE_KEYS):
        if key not in READ_FIELDS:
            continue
        piece = f"try_element_at(a, {i + 1})"
        if types[key].simpleString() == "string":  # '"key":"value"': the value unquoted
            c = F.expr(f"substring({piece}, {len(key) + 5}, length({piece}) - {len(key) + 5})")
        else:
            c = F.expr(f"substring({piece}, {len(key) + 4})").try_cast(types[key])
        cols.append(c.alias(key))
    return lines.select(*cols)


def slim_copy(data: Path, out: Path) -> Path:
    """``data``'s records without the ``UNREAD`` fields, one file for each of its files."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(data.rglob(FILE_GLOB)):
        with open(path) as src, open(out / path.name, "w") as dst:
            for line in src:
                record = json.loads(line)
                dst.write(json.dumps({k: v for k, v in record.items() if k not in UNREAD},
                                     separators=(",", ":")) + "\n")
    return out


def scan(spark: SparkSession, name: str, data: str, slim: str | None) -> DataFrame:
    if name == "text":
        return _text(spark, data)
    if name == "reader":
        return _reader(spark, data, READ_SCHEMA)
    if name == "reader5":
        five = ("v", "type", "ts", "sidecar", "queue")
        return _reader(spark, data, StructType([f for f in READ_SCHEMA.fields
                                                if f.name in five]))
    if name == "slim":
        assert slim is not None
        return _reader(spark, slim, READ_SCHEMA)
    if name == "template":
        return _template(spark, data)
    raise ValueError(f"unknown scan {name!r}: one of {', '.join(SCANS)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="the telemetry (default: written afresh)")
    p.add_argument("--scans", default=",".join(SCANS))
    a = p.parse_args()
    names = a.scans.split(",")
    work = Path(tempfile.mkdtemp(prefix="floodwall-pipeline-parse-"))
    try:
        data = a.data
        if data is None:
            from floodwall_pipeline.synthetic import generate
            data = work / "data"
            generate(data, sidecars=64, hours=1.0, queues=4, seed=64, version=1)
        slim = str(slim_copy(data, work / "slim")) if "slim" in names else None
        spark = spark_session("local[1]", app="floodwall-pipeline-parse",
                              jvm_log=work / "spark.log")
        for name in names:
            for attempt in (1, 2):
                df = scan(spark, name, str(data), slim)
                load, cpu0, t0 = os.getloadavg()[0], _jvm_cpu(spark), time.perf_counter()
                df.agg(F.bit_xor(F.xxhash64(*df.columns))).collect()
                if attempt == 2:
                    print(json.dumps({"scan": name, "cpu_s": round(_jvm_cpu(spark) - cpu0, 2),
                                      "wall_s": round(time.perf_counter() - t0, 2),
                                      "load": [round(load, 1),
                                               round(os.getloadavg()[0], 1)]}), flush=True)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
