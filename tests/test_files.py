"""Model folders are written beside their destination and swapped in whole: a failure or a kill leaves the old
folder or the new one, never a mix (the kill points themselves: tests/test_faults.py)."""

import os
from pathlib import Path

import pytest

from hf_vanilla_transformer import files
from hf_vanilla_transformer.files import replaced_folder


def test_a_new_folder_appears_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with replaced_folder(target) as folder:
        assert folder.parent == target.parent and not target.exists()  # nothing visible while writing
        (folder / "model.safetensors").write_bytes(b"new")
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    assert (target / "model.safetensors").read_bytes() == b"new"
    assert (target / "tokenizer" / "tokenizer.json").read_text() == "{}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # the partial folder is gone


def test_an_existing_folder_keeps_its_other_files(tmp_path: Path) -> None:
    target = tmp_path / "run"
    (target / "checkpoints").mkdir(parents=True)
    (target / "checkpoints" / "kept").write_text("checkpoint")
    (target / "model.safetensors").write_bytes(b"old")
    inode = (target / "model.safetensors").stat().st_ino
    with replaced_folder(target) as folder:
        (folder / "model.safetensors").write_bytes(b"new")
        assert (target / "model.safetensors").read_bytes() == b"old"  # the old file is whole until the end
    assert (target / "model.safetensors").read_bytes() == b"new"
    assert (target / "model.safetensors").stat().st_ino != inode  # replaced by a rename, not rewritten in place
    assert (target / "checkpoints" / "kept").read_text() == "checkpoint"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_an_error_while_writing_leaves_the_old_folder_untouched(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), replaced_folder(target) as folder:
        (folder / "model.safetensors").write_bytes(b"ne")
        raise RuntimeError("disk full")
    assert (target / "model.safetensors").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["model"]


def test_stale_model_files_vanish_and_other_entries_are_carried_over(tmp_path: Path) -> None:
    """Re-writing a folder replaces the model as a whole: an old target_tokenizer/ or weight shard the new model
    does not write is gone, while the run's own entries (checkpoints/, curve/, a results file) stay, the same
    inodes (hard links: nothing copied)."""
    target = tmp_path / "run"
    (target / "target_tokenizer").mkdir(parents=True)
    (target / "target_tokenizer" / "tokenizer.json").write_text("{}")
    (target / "model-00002-of-00002.safetensors").write_bytes(b"old shard")
    (target / "config.json").write_text("old")
    (target / "checkpoints" / "checkpoint-7").mkdir(parents=True)
    (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").write_bytes(b"adam")
    (target / "results.json").write_text("{}")
    inode = (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").stat().st_ino
    with replaced_folder(target) as folder:
        (folder / "config.json").write_text("new")
        (folder / "model.safetensors").write_bytes(b"new")
    assert sorted(path.relative_to(target).as_posix() for path in target.rglob("*")) == [
        "checkpoints",
        "checkpoints/checkpoint-7",
        "checkpoints/checkpoint-7/optimizer.pt",
        "config.json",
        "model.safetensors",
        "results.json",
    ]
    assert (target / "config.json").read_text() == "new"
    assert (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").stat().st_ino == inode
    assert os.listdir(tmp_path) == ["run"]


def test_without_an_atomic_exchange_a_kill_between_the_renames_is_recovered(tmp_path: Path, monkeypatch) -> None:
    """The fallback where renameat2 is unavailable: a writer killed between its two renames left no folder but the
    old one beside it (`.run.old-PID`, PID no longer running) and its complete new one; the next write first puts
    the old folder back and removes the dead writer's leftovers."""
    target = tmp_path / "run"
    dead_pid = 2**22 + 1  # above Linux's pid_max limit: no such process
    (tmp_path / f".run.old-{dead_pid}").mkdir()
    (tmp_path / f".run.old-{dead_pid}" / "config.json").write_text("old")
    (tmp_path / f".run.partial-{dead_pid}").mkdir()
    (tmp_path / f".run.partial-{dead_pid}" / "config.json").write_text("new, never swapped in")
    monkeypatch.setattr(files, "_exchange", lambda first, second: False)
    with replaced_folder(target) as folder:
        assert (target / "config.json").read_text() == "old"  # recovered before anything is written
        (folder / "config.json").write_text("newer")
    assert (target / "config.json").read_text() == "newer"
    assert os.listdir(tmp_path) == ["run"]


def test_existing_file_takes_a_pipe_unless_the_file_is_read_twice(tmp_path) -> None:
    """A FIFO (as bash's `<(...)`) is a file to read once; `regular=True` (training files: cached by size and time,
    read by every process) refuses it naming the option and the fix. Folders and missing paths stay refused."""
    from hf_vanilla_transformer.errors import OptionError

    fifo = tmp_path / "ref.fifo"
    os.mkfifo(fifo)
    assert files.existing_file(fifo, "ref") == fifo
    assert files.existing_file(None, "ref") is None
    refused = r"^`test_tgt` .*ref\.fifo is a pipe or device, not a regular file.*Write it to a file first"
    with pytest.raises(OptionError, match=refused):
        files.existing_file(fifo, "test_tgt", regular=True)
    for path in (tmp_path, tmp_path / "missing"):
        with pytest.raises(OptionError, match=r"does not exist or is not a file\. Check the path\.$"):
            files.existing_file(path, "ref")
