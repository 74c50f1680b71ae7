"""Lay a sidecar's telemetry directory out by date and sidecar, for incremental runs.

    python -m floodwall_pipeline.partition /var/lib/floodwall/telemetry /shipped/telemetry [--move]

Copies (or moves) every closed file of SRC, the proxy's flat ``--telemetry-dir``, to
``DEST/date=YYYY-MM-DD/sidecar=NAME/`` after its name (pipeline/files.py): the layout that
``floodwall analyze --since/--until`` lists one day at a time. The newest file of each
sidecar is still being written and is left alone (``--all`` takes it too, for a stopped
sidecar). A file already at its place with the same size is skipped, so the command can run
from cron next to the sidecar before a ``aws s3 sync DEST s3://BUCKET/telemetry``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from floodwall_pipeline.files import FileName, parse_name, partition_dir


@dataclass(frozen=True)
class Placed:
    source: Path
    target: Path
    copied: bool  # False: it was already there


def plan(src: Path, dest: Path, include_newest: bool = False) -> list[tuple[Path, Path]]:
    """(source, target) for every file to lay out; files not named by the proxy are left."""
    by_sidecar: dict[str, list[tuple[FileName, Path]]] = {}
    for path in sorted(src.iterdir()):
        name = parse_name(path.name) if path.is_file() else None
        if name is not None:
            by_sidecar.setdefault(name.sidecar, []).append((name, path))
    moves = []
    for files in by_sidecar.values():
        files.sort(key=lambda f: (f[0].opened_at, f[0].seq))
        closed = files if include_newest else files[:-1]
        for name, path in closed:
            moves.append((path, dest / partition_dir(name.sidecar, name.opened_at) / path.name))
    return moves


def lay_out(src: Path, dest: Path, move: bool = False, include_newest: bool = False
            ) -> list[Placed]:
    done = []
    for source, target in plan(src, dest, include_newest):
        if target.exists() and target.stat().st_size == source.stat().st_size:
            if move:
                source.unlink()
            done.append(Placed(source, target, False))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")  # readers skip dot files
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        if move:
            source.unlink()
        done.append(Placed(source, target, True))
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--move", action="store_true", help="delete each file once copied")
    p.add_argument("--all", action="store_true", help="also each sidecar's newest file")
    a = p.parse_args()
    placed = lay_out(a.src, a.dest, a.move, a.all)
    print(f"{sum(1 for x in placed if x.copied)} file(s) copied, "
          f"{sum(1 for x in placed if not x.copied)} already there, into {a.dest}")


if __name__ == "__main__":
    main()
