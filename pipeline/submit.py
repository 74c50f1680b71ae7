"""The job for ``spark-submit`` (docs/pipeline.md has the exact commands):

    spark-submit --master spark://HOST:7077 pipeline/submit.py s3a://BUCKET/telemetry/ \\
        --out report/

Same arguments as ``floodwall analyze`` minus ``--master`` (spark-submit sets it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by spark-submit: the repository is the parent
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import SparkSession

from floodwall.control.policy import parse_duration
from floodwall_pipeline.cli import run_analysis
from floodwall_pipeline.recommend import DEFAULT_TARGET_DRAIN


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="floodwall telemetry analysis (spark-submit)")
    p.add_argument("telemetry", nargs="+")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--resolution", type=parse_duration, default=5.0)
    p.add_argument("--target-drain", type=parse_duration, default=DEFAULT_TARGET_DRAIN)
    p.add_argument("--since", help="UTC date or date and time: records from then on")
    p.add_argument("--until", help="UTC date or date and time: records before then")
    p.add_argument("--what-if", action="append", default=[], metavar="CANDIDATE.yaml",
                   help="replay the telemetry through this policy file (repeatable)")
    a = p.parse_args(argv)
    # The master and every --conf are spark-submit's: the session is built without them.
    spark = (SparkSession.builder.appName("floodwall-analyze")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    return run_analysis(a.telemetry, a.out, resolution=a.resolution,
                        target_drain=a.target_drain, spark=spark, since=a.since,
                        until=a.until, what_if=a.what_if)


if __name__ == "__main__":
    raise SystemExit(main())
