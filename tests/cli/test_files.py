"""files.py: model folders are written beside their destination and swapped in whole (a failure or a kill leaves the
old folder or the new one, never a mix; the kill points themselves: tests/training/test_faults.py), and the one rule of
every output: a command writes only into a new or empty folder or one of its own (a manifest lists what it wrote),
replaces only what it wrote, and never writes over its inputs. The commands themselves, with canary files under each
output: tests/cli/test_output_folders.py."""

import json
import os
from pathlib import Path

import pytest

from hf_vanilla_transformer import VanillaTransformerConfig, files
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.files import (
    MANIFEST,
    MODEL_LAYOUT,
    check_output_folder,
    read_manifest,
    replaced_folder,
    writable_file,
)

EARLIER_CONFIG = json.dumps({"model_type": VanillaTransformerConfig.model_type})


def tree(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def own_model_folder(target: Path, **entries: bytes) -> Path:
    """A model folder as this package writes it: `entries` (name -> content) and a manifest listing them."""
    with replaced_folder(target) as folder:
        for name, content in entries.items():
            (folder / name).write_bytes(content)
    return target


def test_a_new_folder_appears_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with replaced_folder(target) as folder:
        assert folder.parent == target.parent and not target.exists()  # nothing visible while writing
        (folder / "model.safetensors").write_bytes(b"new")
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    assert (target / "model.safetensors").read_bytes() == b"new"
    assert (target / "tokenizer" / "tokenizer.json").read_text() == "{}"
    assert read_manifest(target) == files.Manifest("model", frozenset({"model.safetensors", "tokenizer"}))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # the partial folder is gone


def test_an_existing_folder_keeps_the_entries_it_did_not_write(tmp_path: Path) -> None:
    """Own files are replaced by a rename; an entry that appeared since the folder was written (a user's, which
    the commands refuse up front) is carried over as it is."""
    target = own_model_folder(tmp_path / "model", **{"model.safetensors": b"old"})
    (target / "checkpoints").mkdir()
    (target / "checkpoints" / "kept").write_text("checkpoint")
    inode = (target / "model.safetensors").stat().st_ino
    with replaced_folder(target) as folder:
        (folder / "model.safetensors").write_bytes(b"new")
        assert (target / "model.safetensors").read_bytes() == b"old"  # the old file is whole until the end
    assert (target / "model.safetensors").read_bytes() == b"new"
    assert (target / "model.safetensors").stat().st_ino != inode  # replaced by a rename, not rewritten in place
    assert (target / "checkpoints" / "kept").read_text() == "checkpoint"
    assert read_manifest(target).entries == {"model.safetensors"}  # the carried entry stays someone else's
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_a_file_of_someone_elses_is_never_written_over(tmp_path: Path) -> None:
    """A foreign file of a name the new folder writes (one that appeared after the command's check) stops the swap:
    one error naming it, the folder as it was."""
    target = own_model_folder(tmp_path / "model", **{"config.json": b"old"})
    (target / "README.md").write_text("the user's card")
    before = tree(target)
    with pytest.raises(OptionError, match=r"gained README\.md while it was being written.*Move that file away"):
        with replaced_folder(target) as folder:
            (folder / "config.json").write_text("new")
            (folder / "README.md").write_text("generated card")
    assert tree(target) == before and os.listdir(tmp_path) == ["model"]


def test_an_error_while_writing_leaves_the_old_folder_untouched(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), replaced_folder(target) as folder:
        (folder / "model.safetensors").write_bytes(b"ne")
        raise RuntimeError("disk full")
    assert (target / "model.safetensors").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["model"]


def test_a_model_folder_of_an_earlier_version_is_replaced_as_then(tmp_path: Path) -> None:
    """A folder from before manifests, this package's config.json beside its weights: its model files are replaced
    (an old target_tokenizer/ or weight shard the new model does not write is gone), while its other entries (code
    files, results.json, a run's checkpoints/) are carried over, the same inodes (hard links: nothing copied)."""
    target = tmp_path / "model"
    (target / "target_tokenizer").mkdir(parents=True)
    (target / "target_tokenizer" / "tokenizer.json").write_text("{}")
    (target / "model-00002-of-00002.safetensors").write_bytes(b"old shard")
    (target / "config.json").write_text(EARLIER_CONFIG)
    (target / "cpu_inference.py").write_text("# an earlier version's code file")
    (target / "checkpoints" / "checkpoint-7").mkdir(parents=True)
    (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").write_bytes(b"adam")
    (target / "results.json").write_text("{}")
    inode = (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").stat().st_ino
    with pytest.raises(OptionError, match=r"holds files this package did not write \(checkpoints/\)"):
        check_output_folder(target, "output", MODEL_LAYOUT)  # the commands refuse the run's folder up front
    with replaced_folder(target) as folder:
        (folder / "config.json").write_text("new")
        (folder / "model.safetensors").write_bytes(b"new")
    assert sorted(tree(target)) == [
        MANIFEST,
        "checkpoints/checkpoint-7/optimizer.pt",
        "config.json",
        "cpu_inference.py",
        "model.safetensors",
        "results.json",
    ]
    assert (target / "config.json").read_text() == "new"
    assert (target / "checkpoints" / "checkpoint-7" / "optimizer.pt").stat().st_ino == inode
    assert os.listdir(tmp_path) == ["model"]


def test_without_an_atomic_exchange_a_kill_between_the_renames_is_recovered(tmp_path: Path, monkeypatch) -> None:
    """The fallback where renameat2 is unavailable: a writer killed between its two renames left no folder but the
    old one beside it (`.run.old-PID`, PID no longer running) and its complete new one; the next write first puts
    the old folder back and removes the dead writer's leftovers."""
    target = tmp_path / "run"
    dead_pid = 2**22 + 1  # above Linux's pid_max limit: no such process
    own_model_folder(tmp_path / f".run.old-{dead_pid}", **{"config.json": b"old"})
    (tmp_path / f".run.partial-{dead_pid}").mkdir()
    (tmp_path / f".run.partial-{dead_pid}" / "config.json").write_text("new, never swapped in")
    monkeypatch.setattr(files, "_exchange", lambda first, second: False)
    with replaced_folder(target) as folder:
        assert (target / "config.json").read_text() == "old"  # recovered before anything is written
        (folder / "config.json").write_text("newer")
    assert (target / "config.json").read_text() == "newer"
    assert os.listdir(tmp_path) == ["run"]


def test_dot_and_dot_dot_name_the_folder_itself(tmp_path: Path, monkeypatch) -> None:
    """`average CK -o .` made its sibling `..partial-PID` inside `.` and failed (File name too long): the folder is
    taken by its real path, so the sibling lies beside it. The commands refuse the current folder itself first (the
    swap would delete it from under the shell)."""
    (tmp_path / "work" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work" / "sub")
    with pytest.raises(OptionError, match=r"^`output` \. is the current folder or holds it; .*e\.g\. model\.$"):
        check_output_folder(".", "output", MODEL_LAYOUT)
    with replaced_folder(Path("..")) as folder:
        assert folder.parent == tmp_path
        (folder / "config.json").write_text("new")
    assert (tmp_path / "work" / "config.json").read_text() == "new" and os.listdir(tmp_path) == ["work"]


def test_a_folder_with_files_it_did_not_write_is_refused_naming_them(tmp_path: Path) -> None:
    """The issue's `average CK -o F` and `to-marian SRC F`: a user's README.md, config.json and tokenizer.json in F
    were replaced or deleted. Now one line names the folder, the first three foreign files and how many more, and
    the fix; nothing in the folder changes."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("README.md", "config.json", "tokenizer.json", "notes.txt"):
        (folder / name).write_text(f"the user's {name}")
    (folder / "data").mkdir()
    before = tree(folder)
    with pytest.raises(OptionError) as refused:
        check_output_folder(folder, "output", MODEL_LAYOUT)
    message = str(refused.value)
    assert message.startswith(f"`output` {folder} holds files this package did not write (README.md, config.json, ")
    assert "data/ and 2 more)" in message and message.endswith(
        "Choose a new or empty folder, or move those files away."
    )
    assert "\n" not in message
    assert tree(folder) == before


def test_a_folder_is_its_own_only_by_its_manifest_or_an_earlier_versions_model(tmp_path: Path) -> None:
    """New and empty folders pass; a folder this package wrote passes until someone adds a file; a damaged manifest
    makes nothing the package's; a folder of another kind is refused as such; without a manifest, only a model
    folder of an earlier version (this package's config.json beside weights) passes: a Marian or user folder with
    the same file names does not."""
    assert check_output_folder(tmp_path / "new", "output", MODEL_LAYOUT) == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty", "output", MODEL_LAYOUT)

    own = own_model_folder(tmp_path / "own", **{"config.json": b"{}", "model.safetensors": b"w"})
    check_output_folder(own, "output", MODEL_LAYOUT)
    (own / "attention").mkdir()  # the plots train adds: not listed, so someone else's here
    with pytest.raises(OptionError, match=r"\(attention/\)"):
        check_output_folder(own, "output", MODEL_LAYOUT)
    (own / "attention").rmdir()
    (own / MANIFEST).write_text("{not json")
    with pytest.raises(OptionError, match=r"\(config\.json, model\.safetensors\)"):
        check_output_folder(own, "output", MODEL_LAYOUT)

    files.write_manifest(own, "run", ["config.json", "model.safetensors"])
    with pytest.raises(OptionError, match=r"is a run folder of this package, not a model folder; .*new or empty"):
        check_output_folder(own, "output", MODEL_LAYOUT)

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("README.md", "tokenizer.json", "modeling_vanilla_transformer.py", "model.safetensors"):
        (earlier / name).write_text("x")
    (earlier / "config.json").write_text(EARLIER_CONFIG)
    check_output_folder(earlier, "output", MODEL_LAYOUT)
    (earlier / "config.json").write_text(json.dumps({"model_type": "marian"}))  # e.g. a downloaded OPUS-MT model
    with pytest.raises(OptionError, match=r"holds files this package did not write \(README\.md, config\.json"):
        check_output_folder(earlier, "output", MODEL_LAYOUT)


def test_an_output_that_is_holds_or_lies_inside_an_input_is_refused(tmp_path: Path) -> None:
    """`to-marian SRC SRC` overwrote the source model: an output folder that is an input (also through a symbolic
    link), lies inside one or holds one is refused, naming both."""
    source = tmp_path / "source"
    source.mkdir()
    (tmp_path / "link").symlink_to(source)
    inputs = [("source", source)]
    for output, relation in (
        (source, "is"),
        (tmp_path / "link", "is"),
        (source / "out", "lies inside"),
        (tmp_path, "holds"),
    ):
        with pytest.raises(OptionError, match=rf"^`output_dir` {output} {relation} `source` {source}, which this"):
            check_output_folder(output, "output_dir", MODEL_LAYOUT, inputs)
    check_output_folder(tmp_path / "apart", "output_dir", MODEL_LAYOUT, [*inputs, ("reference", None)])


def test_an_output_file_is_no_input_and_no_file_of_a_package_folder(tmp_path: Path) -> None:
    """`evaluate --src x.en --output x.en` turned the source into JSON, `translate CK ... --output CK/config.json`
    overwrote the model's config: an output file that is an input (also a symbolic or hard link to one), lies in an
    input folder, or is among a package folder's own entries is refused. Any other file is the one named: replaced."""
    src = tmp_path / "x.en"
    src.write_text("A dog.\n")
    model = own_model_folder(tmp_path / "model", **{"config.json": b"{}"})
    (tmp_path / "hard.en").hardlink_to(src)
    (tmp_path / "soft.en").symlink_to(src)
    inputs = [("model_dir", tmp_path / "elsewhere"), ("src", src)]
    for output in (src, tmp_path / "hard.en", tmp_path / "soft.en"):
        with pytest.raises(OptionError, match=rf"^`output` {output} is `src` {src}, which this command reads\."):
            writable_file(output, "output", "JSON", "scores.json", inputs)
    with pytest.raises(OptionError, match=r"lies inside `model_dir` .*Pass another file name, e\.g\. scores\.json\."):
        writable_file(model / "scores.json", "output", "JSON", "scores.json", [("model_dir", model)])
    with pytest.raises(OptionError, match=rf"lies inside {model}, a model folder this package wrote, among its own"):
        writable_file(model / "config.json", "output", "JSON", "scores.json", inputs)
    (tmp_path / "scores.json").write_text("old scores")
    assert writable_file(tmp_path / "scores.json", "output", "JSON", "scores.json", inputs) == tmp_path / "scores.json"
    assert src.read_text() == "A dog.\n" and (model / "config.json").read_text() == "{}"


def test_remove_own_removes_what_the_run_wrote_and_nothing_else(tmp_path: Path) -> None:
    """`train --overwrite` removed checkpoints/ whole: a file of the user's that appeared there since the check stays,
    and so does the folder; the Trainer's checkpoints go."""
    from hf_vanilla_transformer.training.run_folder import CHECKPOINTS_LAYOUT

    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint-3").mkdir(parents=True)
    (checkpoints / "checkpoint-3" / "optimizer.pt").write_bytes(b"adam")
    files.remove_own(checkpoints, CHECKPOINTS_LAYOUT)
    assert not checkpoints.exists()
    (checkpoints / "checkpoint-3").mkdir(parents=True)
    (checkpoints / "notes.txt").write_text("mine")
    files.remove_own(checkpoints, CHECKPOINTS_LAYOUT)
    assert tree(checkpoints) == {"notes.txt": b"mine"}


def test_the_layouts_name_what_their_writers_write() -> None:
    """The names files.py and run_folder.py recognize without importing their writers agree with the writers."""
    from hf_vanilla_transformer.inference.attention_maps import ATTENTION_DIR, PLOTS
    from hf_vanilla_transformer.training.learning_curve import CURVE_PNG
    from hf_vanilla_transformer.training.run_folder import MODEL_RUN_ENTRIES

    assert files._MODEL_TYPE == VanillaTransformerConfig.model_type
    assert {ATTENTION_DIR, CURVE_PNG} <= set(MODEL_LAYOUT.earlier) & set(MODEL_RUN_ENTRIES)
    assert all(files._matches(f"{stem}.png", files.ATTENTION_LAYOUT.earlier) for stem, *_ in PLOTS)


def test_existing_file_takes_a_pipe_unless_the_file_is_read_twice(tmp_path) -> None:
    """A FIFO (as bash's `<(...)`) is a file to read once; `regular=True` (training files: cached by size and time,
    read by every process) refuses it naming the option and the fix. Folders and missing paths stay refused."""
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
