"""The record and state directories: created safely, refused when unsafe."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from watchdog.daemon.config import ConfigError
from watchdog.daemon.store.dirs import UnsafeDirectory, check_record_dir, check_state_dir, prepare

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_prepare_creates_both_with_their_modes(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a strict umask must not weaken or block either mode
    try:
        records, state = tmp_path / "run" / "records", tmp_path / "lib" / "state"
        prepare(str(records), str(state))
    finally:
        os.umask(old)
    assert mode(records) == 0o1777
    assert mode(state) == 0o755
    prepare(str(records), str(state))  # again: nothing to do, still fine


def test_prepare_accepts_existing_safe_dirs_without_changing_them(tmp_path: Path) -> None:
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    state.mkdir()
    os.chmod(records, 0o755)  # not shared: fine for a single-user node
    os.chmod(state, 0o700)
    prepare(str(records), str(state))
    assert mode(records) == 0o755 and mode(state) == 0o700


def test_prepare_refuses_an_existing_unsafe_dir(tmp_path: Path) -> None:
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    state.mkdir()
    os.chmod(records, 0o777)
    with pytest.raises(UnsafeDirectory, match="sticky"):
        prepare(str(records), str(state))
    assert mode(records) == 0o777  # reported, not silently fixed
    assert issubclass(UnsafeDirectory, ConfigError)  # the CLI prints it as one line


def test_record_dir_with_sticky_bit_is_accepted(tmp_path: Path) -> None:
    d = tmp_path / "records"
    d.mkdir()
    os.chmod(d, 0o1777)
    check_record_dir(str(d))


@pytest.mark.parametrize("bits", [0o777, 0o775, 0o757])
def test_record_dir_writable_by_others_without_sticky_is_refused(tmp_path: Path,
                                                                 bits: int) -> None:
    d = tmp_path / "records"
    d.mkdir()
    os.chmod(d, bits)
    with pytest.raises(UnsafeDirectory, match="chmod 1777") as err:
        check_record_dir(str(d))
    assert "\n" not in str(err.value)


def test_record_dir_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.chmod(real, 0o1777)
    link = tmp_path / "records"
    link.symlink_to(real)
    with pytest.raises(UnsafeDirectory, match="symlink"):
        check_record_dir(str(link))
    with pytest.raises(UnsafeDirectory, match="symlink"):
        check_state_dir(str(link))


def test_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "records"
    f.write_text("")
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        check_record_dir(str(f))
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        check_state_dir(str(f))
    with pytest.raises(ConfigError):
        prepare(str(f), str(tmp_path / "state"))


def test_missing_dir_raises_oserror_from_the_checks(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check_record_dir(str(tmp_path / "absent"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_dirs_owned_by_another_uid_are_refused(tmp_path: Path) -> None:
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    state.mkdir()
    os.chmod(records, 0o1777)
    os.chmod(state, 0o755)
    os.chown(records, NOBODY, -1)
    os.chown(state, NOBODY, -1)
    with pytest.raises(UnsafeDirectory, match=f"uid {NOBODY}"):
        check_record_dir(str(records))
    with pytest.raises(UnsafeDirectory, match=f"uid {NOBODY}"):
        check_state_dir(str(state))


def test_state_dir_private_modes_are_accepted(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir()
    for bits in (0o755, 0o750, 0o700, 0o711):
        os.chmod(d, bits)
        check_state_dir(str(d))


@pytest.mark.parametrize("bits", [0o775, 0o757, 0o777, 0o1777, 0o770])
def test_state_dir_writable_by_group_or_world_is_refused(tmp_path: Path, bits: int) -> None:
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, bits)
    with pytest.raises(UnsafeDirectory, match="writable by others") as err:
        check_state_dir(str(d))
    assert "chmod 755" in str(err.value)


def test_a_start_refused_by_its_state_directory_leaves_no_record_directory(tmp_path):
    """Issue 56: the record directory (1777) made before the state directory refused
    was left behind, empty; a refused start now leaves nothing it made."""
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)  # unsafe: writable by others
    with pytest.raises(UnsafeDirectory):
        prepare(str(tmp_path / "new" / "records"), str(state))
    assert not (tmp_path / "new").exists()
    assert state.exists()  # not ours: left as it was
