"""core.scratch: tfship's temp folders are removed by their owner, or after its death by the next start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfship.core import scratch
from tfship.core.scratch import OWNER_FILE, make_scratch, remove_orphaned_scratch, remove_own_scratch, scratch_folder


@pytest.fixture()
def temp(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile caches gettempdir(); read TMPDIR again
    return tmp_path


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_scratch_folder_is_private_marked_and_removed_after_its_block(temp):
    with scratch_folder("kind") as folder:
        assert folder.parent == temp and folder.name.startswith("tfship-kind-")
        assert folder.stat().st_mode & 0o777 == 0o700
        assert (folder / OWNER_FILE).read_text() == str(os.getpid())
        (folder / "nested").mkdir()
        (folder / "nested" / "file").write_text("x")
    assert not folder.exists()
    with pytest.raises(RuntimeError), scratch_folder("failing") as failing:
        raise RuntimeError
    assert not failing.exists()


def test_own_folders_are_removed_before_an_os_exit(temp):
    made = [make_scratch("a"), make_scratch("b")]
    remove_own_scratch()
    assert not any(folder.exists() for folder in made) and not scratch._own


def test_a_process_ending_with_os_exit_after_remove_own_scratch_leaves_nothing(temp):
    code = ("import os; from tfship.core.scratch import make_scratch, remove_own_scratch; "
            "(make_scratch('ssl') / 'tls_key.pem').write_text('secret'); remove_own_scratch(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(temp)}, check=True)
    assert not list(temp.iterdir())


def test_only_folders_of_dead_owners_are_removed(temp):
    def folder(name: str, owner: str | None, file: str = OWNER_FILE):
        path = temp / name
        path.mkdir()
        (path / "worker.log").write_text("x")
        if owner is not None:
            (path / file).write_text(owner)
        return path

    dead = _dead_pid()
    orphans = [folder("tfship-workers-dead", str(dead)), folder("tfship-ssl-dead", str(dead)),
               folder("tfship-workers-legacy", str(dead), "parent.pid")]  # the --num-processes parent's old marker
    kept = [folder("tfship-serve-alive", str(os.getppid())), folder("tfship-promote-mine", str(os.getpid())),
            folder("tfship-train-workers-unmarked", None),  # being made right now, or an older tfship's
            folder("tfship-tflite-garbled", "12ab"), folder("other-dead", str(dead))]
    (temp / "tfship-file-not-a-folder").write_text(str(dead))
    os.symlink(orphans[0], temp / "tfship-link")
    assert sorted(remove_orphaned_scratch(temp)) == sorted(orphans)
    assert not any(path.exists() for path in orphans)
    assert all(path.is_dir() for path in kept) and (temp / "tfship-file-not-a-folder").is_file()


def test_a_missing_temp_directory_removes_nothing(tmp_path):
    assert remove_orphaned_scratch(tmp_path / "absent") == []
