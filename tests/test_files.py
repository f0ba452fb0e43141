"""Model folders are written beside their destination and moved in: a failure or a kill leaves no half file."""

import os
from pathlib import Path

import pytest

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
