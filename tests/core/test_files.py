"""The output module's rules, each tried the way it could break: races, failures mid-write, odd names."""

from __future__ import annotations

import errno
import json
import os
import threading

import pytest

from anima_rknn.core import files
from anima_rknn.core.files import (
    Unreadable,
    atomic_path,
    check_output_file,
    json_text,
    open_small_file,
    output_folder,
    read_small_file,
    write_json,
)
from anima_rknn.errors import AnimaError


def test_publishes_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    write_json(target, {"x": 1}, overwrite=False)
    assert json.loads(target.read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_an_error_inside_the_block_publishes_nothing(tmp_path):
    target = tmp_path / "a.png"
    with pytest.raises(RuntimeError), atomic_path(target, overwrite=True) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_appears_during_the_work_is_not_replaced(tmp_path):
    target = tmp_path / "a.png"
    with pytest.raises(AnimaError, match="appeared while this run was working"):
        with atomic_path(target, overwrite=False) as tmp:
            tmp.write_bytes(b"ours")
            target.write_bytes(b"theirs")  # another program writes the same path meanwhile
    assert target.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]


def test_overwrite_replaces_at_publish_time(tmp_path):
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    with atomic_path(target, overwrite=True) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"


def test_of_many_racing_writers_exactly_one_wins(tmp_path):
    target = tmp_path / "race.txt"
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        try:
            with atomic_path(target, overwrite=False) as tmp:
                tmp.write_text(str(i))
                barrier.wait()  # every writer has passed the up-front check before any publishes
            outcomes.append("won")
        except AnimaError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]
    assert [p.name for p in tmp_path.iterdir()] == ["race.txt"]


def test_without_hard_links_the_name_is_claimed_exclusively(tmp_path, monkeypatch):
    """FAT file systems (SD cards) have no hard links: the fallback must keep the no-replace rule."""
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "a.png"
    with atomic_path(target, overwrite=False) as tmp:
        tmp.write_bytes(b"first")
    assert target.read_bytes() == b"first"
    with pytest.raises(AnimaError, match="appeared while this run was working"):
        with atomic_path(tmp_path / "b.png", overwrite=False) as tmp:
            tmp.write_bytes(b"ours")
            (tmp_path / "b.png").write_bytes(b"theirs")
    assert (tmp_path / "b.png").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]


@pytest.mark.parametrize("name, pattern", [
    ("x" * 241 + ".png", "bytes long"),
    ("x.jpg", "must be a .png file"),
    ("\ud800.png", "not valid text"),  # a lone surrogate no file system encoding can write
])
def test_names_are_checked_before_the_work(tmp_path, name, pattern):
    with pytest.raises(AnimaError, match=pattern):
        check_output_file(tmp_path / name, overwrite=False, suffixes=(".png",))


def test_the_longest_accepted_name_can_really_be_written(tmp_path):
    name = "x" * (255 - 15 - 4) + ".png"
    path = check_output_file(tmp_path / name, overwrite=False, suffixes=(".png",))
    with atomic_path(path, overwrite=False) as tmp:
        tmp.write_bytes(b"ok")
    assert path.read_bytes() == b"ok"


def test_output_folder_rules(tmp_path):
    folder = tmp_path / "set"
    assert output_folder(folder, overwrite=False, holds="x").is_dir()  # new: created
    assert output_folder(folder, overwrite=False, holds="x") == folder  # empty: fine
    (folder / "theirs.txt").write_text("keep")
    with pytest.raises(AnimaError, match="is not empty"):
        output_folder(folder, overwrite=False, holds="other files")
    (folder / "progress.json").write_text("{}")
    assert output_folder(folder, overwrite=False, holds="x", resumable="progress.json") == folder
    (folder / "progress.json").unlink()
    (folder / "progress.json").symlink_to(tmp_path / "elsewhere.json")  # a planted marker is not ours
    with pytest.raises(AnimaError, match="is not empty"):
        output_folder(folder, overwrite=False, holds="x", resumable="progress.json")
    with pytest.raises(AnimaError, match="bytes long"):
        output_folder(tmp_path / "new", overwrite=False, holds="x", names=["y" * 250])
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(AnimaError, match="is a file, not a folder"):
        output_folder(tmp_path / "file", overwrite=True, holds="x")


def test_json_is_strict():
    text = json_text({"psnr": float("inf"), "nan": float("nan"), "list": [1.5, float("-inf")]})
    assert json.loads(text) == {"psnr": "inf", "nan": "nan", "list": [1.5, "-inf"]}
    assert "NaN" not in text and "Infinity" not in text


def test_is_temporary_recognises_only_our_temporaries(tmp_path):
    with atomic_path(tmp_path / "a.png", overwrite=False) as tmp:
        assert files.is_temporary(tmp)
        tmp.write_bytes(b"x")
    assert not files.is_temporary(tmp_path / "a.png")


def test_a_replaced_folder_appears_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "old").write_text("damaged")
    with pytest.raises(RuntimeError):
        with files.replaced_folder(folder) as staging:
            staging.mkdir()
            (staging / "half").write_text("x")
            raise RuntimeError("killed mid-write")
    assert [p.name for p in folder.iterdir()] == ["old"]  # a failed write leaves the old folder as it was
    with files.replaced_folder(folder) as staging:  # the failed attempt's staging is cleared first
        assert not staging.exists()
        staging.mkdir()
        (staging / "new").write_text("whole")
    assert [p.name for p in folder.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no staging or stale folder left


def test_an_exclusive_lock_admits_one_holder_at_a_time(tmp_path):
    inside, overlaps = [], []

    def hold() -> None:
        with files.exclusive_lock(tmp_path / ".lock"):
            inside.append(1)
            overlaps.append(len(inside))
            threading.Event().wait(0.05)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [1, 1, 1, 1]


def test_a_small_file_opened_for_reading_in_parts_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    big = tmp_path / "records.jsonl"
    with open(big, "wb") as f:
        f.truncate(2**40)  # sparse: 1 TiB that would take hours to read
    for opened in (lambda: open_small_file(big, 2**20).__enter__(), lambda: read_small_file(big, 2**20)):
        with pytest.raises(Unreadable, match="^larger than 1 MiB$"):
            opened()
    big.write_bytes(b"one\ntwo\n")
    with open_small_file(big, 8) as f:
        assert [f.readline(), f.readline(), f.readline()] == [b"one\n", b"two\n", b""]


def test_a_small_file_read_without_links_refuses_symbolic_and_hard_ones(tmp_path):
    """no_links: only a file under its one name is read (a served job PNG must not be another file's name)."""
    plain = tmp_path / "plain.png"
    plain.write_bytes(b"data")
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    (tmp_path / "symbolic.png").symlink_to(outside)
    os.link(outside, tmp_path / "hard.png")
    assert read_small_file(plain, 16, no_links=True) == b"data"
    for name in ("symbolic.png", "hard.png"):
        assert read_small_file(tmp_path / name, 16) == b"secret"  # a plain read follows them
        with pytest.raises(Unreadable, match="not a regular file"):
            read_small_file(tmp_path / name, 16, no_links=True)


def test_a_held_folder_refuses_a_second_holder_in_the_callers_words(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with files.held_folder(lambda: folder) as held:
        assert held == folder
        with pytest.raises(AnimaError, match=f"^another anima-rknn run is writing into {folder}; wait for it"):
            with files.held_folder(lambda: folder):
                pass
        with pytest.raises(AnimaError, match=f"^{folder} is mine$"):
            with files.held_folder(lambda: folder, busy="{folder} is mine"):
                pass
    with files.held_folder(lambda: folder):  # let go when the block ended
        pass
    with pytest.raises(AnimaError, match=f"^cannot open the folder {tmp_path / 'absent'}: No such file"):
        with files.held_folder(lambda: tmp_path / "absent"):
            pass


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_folder_on_a_file_system_without_locks_is_used_unguarded_and_the_caller_told(tmp_path, monkeypatch, code):
    """No local file system here refuses flock, so the kernel's answer of a network mount is put in its place."""
    import fcntl

    def refuse(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", refuse)
    told = []
    with files.held_folder(lambda: tmp_path, unguarded=told.append) as held:
        assert held == tmp_path
    assert told == [f"warning: cannot lock {tmp_path} ({os.strerror(code)}): a second run on it would not be "
                    "refused"]
    with files.held_folder(lambda: tmp_path):  # a caller that asked not to be told
        pass


def test_a_lock_that_fails_for_another_reason_is_refused(tmp_path, monkeypatch):
    import fcntl

    def fail(fd, operation):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fcntl, "flock", fail)
    ran = []
    with pytest.raises(AnimaError, match=f"^cannot lock the folder {tmp_path}: Input/output error$"):
        with files.held_folder(lambda: tmp_path, unguarded=ran.append):
            ran.append("block")
    assert ran == []
