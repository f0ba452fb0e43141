"""The model room (hf_vanilla_transformer/model/): exactly the files a saved folder carries as remote code, importing
nothing from the rest of the package and keeping no process state; and folders saved before the room existed still
load, with the package and as remote code without it."""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import hf_vanilla_transformer.model
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration

from ..conftest import CODE_FILES, random_batch, run_script, tiny_model

MODEL_ROOM = Path(hf_vanilla_transformer.model.__file__).parent
ROOM_FILES = frozenset(path.name for path in MODEL_ROOM.glob("*.py") if path.name != "__init__.py")
# What the room's files may import besides the standard library and each other: huggingface_hub is a dependency of
# transformers, whose own configs take `@strict` and its field validators from it.
ALLOWED_PACKAGES = frozenset({"torch", "transformers", "huggingface_hub", "safetensors"})
# A folder saved by the package at git commit bb52315, before the room (its README.md says how it was made).
OLD_FOLDER = Path(__file__).parents[1] / "fixtures" / "folder_bb52315"


def forbidden_imports(path: Path) -> list[str]:
    """The imports of `path` (anywhere in it) outside the standard library, ALLOWED_PACKAGES and single-dot relative
    imports of the room's own files."""
    stems = {Path(name).stem for name in ROOM_FILES}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            tops = [(alias.name, alias.name.split(".")[0]) for alias in node.names]
            found += [name for name, top in tops if top not in ALLOWED_PACKAGES | set(sys.stdlib_module_names)]
        elif isinstance(node, ast.ImportFrom):
            line = f"from {'.' * node.level}{node.module or ''} import ..."
            if node.level == 0:
                top = (node.module or "").split(".")[0]
                if top not in ALLOWED_PACKAGES | set(sys.stdlib_module_names) | {"__future__"}:
                    found.append(line)
            elif node.level > 1:
                found.append(line)
            elif node.module is not None and node.module not in stems:
                found.append(line)
            elif node.module is None and any(alias.name not in stems for alias in node.names):
                found.append(line)
    return found


def test_the_room_imports_only_torch_transformers_huggingface_hub_safetensors_and_itself() -> None:
    assert ROOM_FILES, MODEL_ROOM
    assert {name: forbidden_imports(MODEL_ROOM / name) for name in sorted(ROOM_FILES)} == {
        name: [] for name in sorted(ROOM_FILES)
    }
    # The check sees what it must refuse.
    sample = MODEL_ROOM.parent / "inference" / "cpu_inference.py"
    assert forbidden_imports(sample) == [] and sample.exists()  # the speed step itself imports only torch...
    assert forbidden_imports(MODEL_ROOM.parent / "registration.py")  # ...the rest of the package does not


def test_the_room_is_what_a_saved_folder_carries(tmp_path: Path) -> None:
    tiny_model().save_pretrained(tmp_path)
    assert {path.name for path in tmp_path.glob("*.py")} == CODE_FILES == ROOM_FILES


# Run in a subprocess (argv: model folder, scratch folder, output file, "with" or "without" the package): the
# process state before and after importing the model code, `from_pretrained` and `generate()`, after a control run
# of a BART model (save, load, generate) that takes transformers' and torch's own lazy imports and their effects.
SNAPSHOT_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, logging, sys, warnings
    import torch, transformers
    from transformers import AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration

    folder, scratch, out_file, mode = sys.argv[1:5]
    ROOM = set(json.loads(sys.argv[5]))
    opened = []  # libraries opened through ctypes (glibc's mallopt is reached through one)
    open_library = ctypes.CDLL.__init__
    def recording_open(self, name, *args, **kwargs):
        opened.append(str(name))
        open_library(self, name, *args, **kwargs)
    ctypes.CDLL.__init__ = recording_open

    def process_state():
        hooks = torch.nn.modules.module
        optimizer = sys.modules["torch.optim.optimizer"]
        return {
            "module hooks": {n: len(v) for n, v in vars(hooks).items() if n.startswith("_global_") and "hooks" in n},
            "optimizer hooks": [len(optimizer._global_optimizer_pre_hooks),
                                len(optimizer._global_optimizer_post_hooks)],
            "warnings filters": [repr(entry) for entry in warnings.filters],
            "logging": [logging.getLogger().level, logging.getLogger("transformers").level,
                        len(logging.getLogger("transformers").handlers), transformers.logging.get_verbosity()],
            "mkldnn": [torch.backends.mkldnn.enabled, torch.backends.mkldnn.deterministic],
            "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
            "default dtype": str(torch.get_default_dtype()),
            "grad enabled": torch.is_grad_enabled(),
            "ctypes libraries opened": list(opened),
        }

    def room_state():
        # Every module-level container and cache of the room's modules, wherever they were loaded from.
        state = {}
        for name, module in sorted(sys.modules.items()):
            if name.rsplit(".", 1)[-1] in ROOM:
                for key, value in vars(module).items():
                    if key.startswith("__"):
                        continue
                    if isinstance(value, (dict, list, set, bytearray)):
                        state[name + "." + key] = repr(value)
                    elif hasattr(value, "cache_info"):
                        state[name + "." + key] = repr(value.cache_info())
        return state

    def generate(model):
        ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 1, 1]])
        mask = (ids != 1).long()
        for beams in (1, 2):
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, num_beams=beams)

    size = dict(encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    size |= dict(encoder_ffn_dim=32, decoder_ffn_dim=32, d_model=16, vocab_size=61, max_position_embeddings=64)
    BartForConditionalGeneration(BartConfig(**size)).save_pretrained(scratch)
    generate(AutoModelForSeq2SeqLM.from_pretrained(scratch))
    opened.clear()
    before = process_state()
    if mode == "with":
        import hf_vanilla_transformer
    remote = {"trust_remote_code": True} if mode == "without" else {}
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, **remote)
    room_before = room_state()
    generate(model)
    generate(AutoModelForSeq2SeqLM.from_pretrained(folder, **remote))
    json.dump({
        "module": type(model).__module__,
        "process": [before, process_state()],
        "room": [room_before, room_state()],
    }, open(out_file, "w"))
    """
)


@pytest.mark.parametrize("package", [True, False], ids=["with-the-package", "remote-code"])
def test_loading_and_generating_leave_the_process_state_alone(package: bool, tmp_path: Path) -> None:
    """Importing the room's files (with the package: importing the package), `from_pretrained` and `generate()`
    register no module or optimizer hook, open no C library (glibc's allocator settings), change no warnings filter,
    logging level, oneDNN flag, thread count or default dtype, and grow no module-level container or cache of the
    room's modules."""
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    out = tmp_path / "state.json"
    stems = json.dumps(sorted(Path(name).stem for name in ROOM_FILES))
    mode = "with" if package else "without"
    result = run_script(
        SNAPSHOT_SCRIPT, tmp_path, str(folder), str(tmp_path / "bart"), str(out), mode, stems, package=package
    )
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(out.read_text())
    expected_module = "hf_vanilla_transformer.model." if package else "transformers_modules."
    assert state["module"].startswith(expected_module)
    before, after = state["process"]
    assert {key: after[key] for key in before if after[key] != before[key]} == {}
    room_before, room_after = state["room"]
    assert room_before, "no module of the room was found"
    assert room_after == room_before


# argv: model folder, output file. Loads the folder as remote code and writes its class's module, its logits on a
# fixed batch and its greedy and beam tokens.
OLD_FOLDER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForSeq2SeqLM
    folder, out_file = sys.argv[1:3]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    batch = {key: torch.tensor(value) for key, value in json.loads(sys.argv[3]).items()}
    with torch.no_grad():
        logits = model(**batch).logits
    tokens = {beams: model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    max_new_tokens=6, num_beams=beams).tolist() for beams in (1, 3)}
    json.dump({"module": type(model).__module__, "logits": logits.tolist(), "tokens": tokens}, open(out_file, "w"))
    """
)


def test_a_folder_saved_before_the_room_loads_with_and_without_the_package(tmp_path: Path) -> None:
    """tests/fixtures/folder_bb52315 (its code files include the old cpu_inference.py): loaded with the package it
    becomes this package's model; loaded as remote code without the package its own files run. Both give the logits
    and tokens of the package's model on the same weights."""
    assert (OLD_FOLDER / "cpu_inference.py").exists()  # the fixture is the old layout
    batch = random_batch()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(OLD_FOLDER)
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    reference = tiny_model()
    reference.load_state_dict(loaded.state_dict())
    with torch.no_grad():
        expected = reference(**batch).logits
        torch.testing.assert_close(loaded(**batch).logits, expected, atol=0, rtol=0)
    out = tmp_path / "old.json"
    inputs = json.dumps({key: value.tolist() for key, value in batch.items()})
    result = run_script(OLD_FOLDER_SCRIPT, tmp_path, str(OLD_FOLDER), str(out), inputs, package=False)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(out.read_text())
    assert remote["module"].startswith("transformers_modules.")
    torch.testing.assert_close(torch.tensor(remote["logits"]), expected, atol=1e-5, rtol=1e-5)
    for beams, tokens in remote["tokens"].items():
        generated = reference.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            max_new_tokens=6,
            num_beams=int(beams),
        )
        assert tokens == generated.tolist()
