"""Every vhost and queue name gets a directory of its own, two levels under the spool root
(``spool.names``): dot-only names, slashes, NUL, long names; the directories an older
floodwall made are still found."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.cli import main
from floodwall.spool.log import QueueSpool
from floodwall.spool.manager import SpoolError, SpoolManager
from floodwall.spool.names import (
    NAME_MAX,
    SpoolPathError,
    dir_name,
    name_of,
    queue_directory,
)
from floodwall.spool.records import SpoolRecord

PROPS = bytes.fromhex("003c0000000000000000000a0000")
HOSTILE = [".", "..", "...", "....", "a.b", ".hidden", "/", "a/b", "../x", "x/..", "\x00",
           "a\x00b", "%", "%2E", "", " ", "\n", "~", "é", "\u2028", "-", "cursor", ".lock"]


def rec(i: int) -> SpoolRecord:
    return SpoolRecord(0, 1000.0 + i, "", "q", PROPS, f"body-{i}".encode())


@pytest.mark.parametrize("name", [".", "..", "...", "...."])
def test_dot_only_names_have_their_dots_encoded(name: str) -> None:
    assert dir_name(name) == "%2E" * len(name)


def test_other_names_keep_the_encoding_existing_spools_use() -> None:
    for name in ["orders", "a.b", ".hidden", "a/b", "\x00", "%", "é", "a b"]:
        assert dir_name(name) == urllib.parse.quote(name, safe="")
    assert dir_name("") == "%"


@given(st.text(min_size=0, max_size=300))
@settings(max_examples=400)
def test_any_name_is_one_directory_directly_under_its_parent(name: str) -> None:
    encoded = dir_name(name)
    assert "/" not in encoded and "\x00" not in encoded
    assert encoded not in (".", "..")
    assert 0 < len(encoded.encode()) <= NAME_MAX


@given(st.lists(st.text(alphabet="./%\x00ab", max_size=6), min_size=2, max_size=6,
                unique=True))
@settings(max_examples=200)
def test_different_names_never_share_a_directory(names: list[str]) -> None:
    assert len({dir_name(n) for n in names}) == len(names)


@pytest.mark.parametrize("vhost", ["/", ".", ".."])
def test_every_hostile_name_is_two_levels_under_the_root(tmp_path: Path, vhost: str) -> None:
    for name in HOSTILE:
        path = queue_directory(tmp_path, (vhost, name)).resolve()
        assert path.parent.parent == tmp_path.resolve(), name


def test_each_queue_its_own_spool_recovered_after_a_restart(tmp_path: Path) -> None:
    manager = SpoolManager(tmp_path)
    keys = [("/", n) for n in HOSTILE] + [(".", "."), ("..", ".."), ("", "q")]
    for i, key in enumerate(keys):
        for j in range(i % 3 + 1):
            manager.append(key, rec(j), 1 << 20)
    manager.sync()
    manager.close()
    again = SpoolManager(tmp_path)
    reports = again.recover()
    assert again.unreadable == []
    assert sorted(reports) == sorted(keys)
    for i, key in enumerate(keys):
        assert reports[key].records == i % 3 + 1, key
    assert not list(tmp_path.glob("*.seg")) and not list(tmp_path.glob("*/*.seg"))
    assert again.purge(("/", "..")) == 2
    rest = SpoolManager(tmp_path).recover()
    assert sorted(rest) == sorted(k for k in keys if k != ("/", ".."))


def test_a_spool_made_by_the_old_encoding_is_still_recovered(tmp_path: Path) -> None:
    legacy = tmp_path / "%2F" / "..."  # how a queue named "..." was stored before
    old = QueueSpool(legacy)
    for i in range(3):
        old.append(rec(i))
    old.sync()
    old.close()
    manager = SpoolManager(tmp_path)
    reports = manager.recover()
    assert reports[("/", "...")].records == 3
    manager.append(("/", "..."), rec(3), 1 << 20)  # appends go on in the same directory
    manager.sync()
    manager.close()
    assert not (tmp_path / "%2F" / "%2E%2E%2E").exists()
    assert len(list(QueueSpool(legacy).records())) == 4
    out = CliRunner().invoke(main, ["spool", "show", "...", "--spool-dir", str(tmp_path)])
    assert out.exit_code == 0 and out.output.count("body-") == 4, out.output


def test_a_long_name_is_a_digest_directory_that_names_itself(tmp_path: Path) -> None:
    name = "é/" * 120  # 360 bytes of UTF-8: its percent-encoding is far past NAME_MAX
    vhost = "v" + "%" * 100
    manager = SpoolManager(tmp_path)
    manager.append((vhost, name), rec(0), 1 << 20)
    manager.sync()
    manager.close()
    directory = queue_directory(tmp_path, (vhost, name))
    assert directory.name.startswith("%%") and name_of(directory) == name
    assert name_of(directory.parent) == vhost
    again = SpoolManager(tmp_path)
    assert again.recover()[(vhost, name)].records == 1


def test_a_link_out_of_the_root_is_refused_with_a_reason(tmp_path: Path) -> None:
    root, outside = tmp_path / "spool", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "%2F").symlink_to(outside)
    with pytest.raises(SpoolPathError, match="two levels under the spool root"):
        queue_directory(root, ("/", "q"))
    manager = SpoolManager(root)
    with pytest.raises(SpoolError, match="refusing it"):
        manager.append(("/", "q"), rec(0), 1 << 20)
    assert list(outside.iterdir()) == []


def test_cli_purge_of_dotdot_purges_only_that_queue(tmp_path: Path) -> None:
    manager = SpoolManager(tmp_path)
    for key in [("/", ".."), ("/", "."), ("/", "orders"), ("other", "x")]:
        manager.append(key, rec(0), 1 << 20)
    manager.sync()
    manager.close()
    runner = CliRunner()
    ls = runner.invoke(main, ["spool", "ls", "--spool-dir", str(tmp_path)])
    assert ls.exit_code == 0
    shown = {tuple(line.split()[:2]) for line in ls.output.splitlines()[1:-1]}
    assert shown == {("/", ".."), ("/", "."), ("/", "orders"), ("other", "x")}
    out = runner.invoke(main, ["spool", "purge", "..", "--vhost", "/", "--yes",
                               "--spool-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    left = SpoolManager(tmp_path).recover()
    assert sorted(left) == [("/", "."), ("/", "orders"), ("other", "x")]
    assert all(r.records == 1 for r in left.values())
    missing = runner.invoke(main, ["spool", "purge", "..", "--vhost", "/", "--yes",
                                   "--spool-dir", str(tmp_path)])
    assert missing.exit_code != 0 and "no spool for queue '..'" in missing.output
