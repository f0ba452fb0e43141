"""Uploading to the Hub and loading from it, end to end against a local fake Hub (tests/fake_hub.py: an HTTP
server on 127.0.0.1 that huggingface_hub talks to as it talks to the Hub): `train --push-to-hub`, the `push`
command and its errors, transformers' own push_to_hub, and from_pretrained of the uploaded repository with and
without this package installed."""

import json
import os
import socket
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, constants
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_vanilla_transformer.training.train as train_module
from hf_vanilla_transformer.files import MANIFEST
from hf_vanilla_transformer.hub import push_folder_to_hub
from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config
from model_card import write_model_card

from ..conftest import CODE_FILES, run, run_script, tiny_model, tiny_tokenizer, write_multi30k_sample

TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}
MODEL_FILES = {"model.safetensors", "config.json", "generation_config.json", "README.md"} | CODE_FILES


def folder_files(folder: Path) -> set[str]:
    """The folder's files but the package's manifests (files.MANIFEST), which stay local."""
    files = [path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST]
    return {path.relative_to(folder).as_posix() for path in files}


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    """A model folder at the top of a run folder (the layout before RUN/model): model, tokenizer, card, plus a
    training run's files, which must stay local."""
    model = tiny_model()
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    write_model_card(tmp_path, languages=["en", "de"], datasets=["wmt/wmt14"])
    (tmp_path / "checkpoint-100").mkdir()
    (tmp_path / "checkpoint-100" / "model.safetensors").write_bytes(b"old")
    (tmp_path / "checkpoint-100" / "modeling_vanilla_transformer.py").write_text("# old copy\n")
    (tmp_path / "training_args.bin").write_bytes(b"\x00")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "events.out.tfevents").write_bytes(b"\x00")
    return tmp_path


def check_config(content: bytes) -> None:
    config = json.loads(content)
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    )
    assert config["auto_map"]["AutoConfig"] == "configuration_vanilla_transformer.VanillaTransformerConfig"
    pipeline = {"impl": "pipeline_vanilla_translation.VanillaTranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"]}
    assert config["custom_pipelines"]["translation"] == pipeline


# ------------------------------------------------------------------------------- train, push, load from the Hub

REMOTE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    repo_id, sentences = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
    tokens = model.generate(**tokenizer(sentences, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=8)
    print("RESULT", json.dumps({"module": type(model).__module__, "tokens": tokens.tolist()}))
    """
)


def test_train_pushes_its_model_folder_which_loads_from_the_hub(hub, tmp_path, capsys, monkeypatch) -> None:
    """`train --push-to-hub`: the upload is exactly the files of RUN/model, in one commit, byte for byte (the card
    rendered with the repository's id); from_pretrained of the repository from the fake Hub gives the same greedy
    tokens as the local folder, with this package and, as remote code, in a process that cannot import it."""
    url, state = hub
    # The attention figures of the first layer and head only: drawing every layer's grid of an untrained model's
    # 50-token outputs takes half a minute, and the figures are tested in test_cli.py.
    plot = train_module.plot_attention_maps
    monkeypatch.setattr(
        train_module, "plot_attention_maps", lambda options: plot(replace(options, layers=[0], heads=[0]))
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_multi30k_sample(corpus, 200, 2)
    run_dir = tmp_path / "run"
    argv = [
        "train",
        *("--train-src", str(corpus / "train.en"), "--train-tgt", str(corpus / "train.de")),
        *("--test-src", str(corpus / "test.en"), "--test-tgt", str(corpus / "test.de")),
        *("--vocab-size", "300", "--max-tokens", "1024", "--max-steps", "2", "--save-every", "0.001"),
        *("--average-last", "2", "--output-dir", str(run_dir), "--examples", "0", "--no-progress"),
        *("--license", "cc-by-nc-4.0", "--push-to-hub", "me/tiny-en-de"),
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    model_dir = run_dir / "model"
    assert f"Pushed {len(folder_files(model_dir))} files of {model_dir} to {url}/me/tiny-en-de/commit/" in out
    ((repo_id, branch, added, deleted),) = state.commits
    assert (repo_id, branch, deleted) == ("me/tiny-en-de", "main", [])
    assert set(added) == folder_files(model_dir) and "results.json" in added and "tokenizer.json" in added
    files = state.files("me/tiny-en-de")
    assert set(files) == set(added) | {".gitattributes"}
    for name in added:
        assert files[name] == (model_dir / name).read_bytes(), name
    card = ModelCard(files["README.md"].decode())
    assert 'from_pretrained("me/tiny-en-de", trust_remote_code=True)' in card.text
    assert "replace it with the Hub repository id" not in card.text
    assert card.data.license == "cc-by-nc-4.0" and card.data.eval_results

    sentences = ["A man is riding a bike.", "Two dogs play in the snow."]
    local = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    local_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = local.generate(
        **local_tokenizer(sentences, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=8
    ).tolist()
    remote = AutoModelForSeq2SeqLM.from_pretrained("me/tiny-en-de").eval()  # this package's class (imported)
    remote_tokenizer = AutoTokenizer.from_pretrained("me/tiny-en-de")
    tokens = remote.generate(
        **remote_tokenizer(sentences, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=8
    )
    assert type(remote).__module__ == "hf_vanilla_transformer.model.modeling_vanilla_transformer"
    assert tokens.tolist() == expected

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))}
    env |= {"HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf-home")}  # no token: downloads need none
    result = run_script(REMOTE_SCRIPT, tmp_path, "me/tiny-en-de", json.dumps(sentences), package=False, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    without_package = json.loads(line.removeprefix("RESULT "))
    assert without_package["module"].startswith("transformers_modules")
    assert without_package["tokens"] == expected
    assert state.unknown == []


# ------------------------------------------------------------------------------- the push command


def test_push_folder_uploads_exactly_the_hub_files(hub, output_dir: Path) -> None:
    _, state = hub
    push_folder_to_hub(output_dir, "me/tiny")
    ((repo_id, _, paths, _),) = state.commits
    assert repo_id == "me/tiny"
    assert set(paths) == MODEL_FILES | TOKENIZER_FILES and len(paths) == len(set(paths))
    files = state.files("me/tiny")
    for path in paths:
        assert files[path] == (output_dir / path).read_bytes()
    check_config(files["config.json"])
    assert json.loads(files["generation_config.json"])["length_penalty_type"] == "gnmt"
    card = ModelCard(files["README.md"].decode())
    assert card.data.pipeline_tag == "translation" and "vanilla-transformer" in card.data.tags
    assert state.unknown == []


def test_model_and_tokenizer_push_to_hub(hub) -> None:
    _, state = hub
    model = tiny_model()
    model.push_to_hub("me/pushed")
    tiny_tokenizer().push_to_hub("me/pushed")
    (_, _, model_paths, _), (_, _, tokenizer_paths, _) = state.commits
    assert set(model_paths) == MODEL_FILES
    assert set(tokenizer_paths) == TOKENIZER_FILES | {"README.md"}
    check_config(state.files("me/pushed")["config.json"])


def test_push_to_hub_after_the_folder_keeps_our_card(hub, output_dir: Path) -> None:
    _, state = hub
    push_folder_to_hub(output_dir, "me/tiny")
    ours = ModelCard(state.files("me/tiny")["README.md"].decode())
    tiny_model().push_to_hub("me/tiny")  # transformers loads the existing card and only adds tags
    after = ModelCard(state.files("me/tiny")["README.md"].decode())
    assert after.text == ours.text and after.data.pipeline_tag == "translation"


def test_push_command_a_branch_and_a_repository_with_other_content(hub, output_dir, capsys) -> None:
    """`push --revision dev` creates the branch and leaves main alone; a second push of the model updates it; a
    repository holding other files is refused (exit 2, one line naming them) and replaced with --force, which
    deletes them in the upload's commit."""
    _, state = hub
    code, out, err = run(["push", str(output_dir), "me/tiny", "--revision", "dev"], capsys)
    assert code == 0 and out.startswith(f"Pushed {len(MODEL_FILES | TOKENIZER_FILES)} files to me/tiny: "), err
    assert set(state.files("me/tiny", "dev")) == MODEL_FILES | TOKENIZER_FILES | {".gitattributes"}
    assert set(state.files("me/tiny", "main")) == {".gitattributes"}
    assert run(["push", str(output_dir), "me/tiny"], capsys)[0] == 0
    assert run(["push", str(output_dir), "me/tiny"], capsys)[0] == 0  # the same model again: an update

    repo = state.repos["me/tiny"]
    repo.commits["other"] = {**state.files("me/tiny"), "other_model.bin": b"x", "notes/a.txt": b"y"}
    repo.branches["main"] = "other"
    commits = len(state.commits)
    code, _, err = run(["push", str(output_dir), "me/tiny"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "me/tiny already holds files that are not this model's (notes/a.txt, other_model.bin)" in err
    assert "--force" in err and len(state.commits) == commits
    code, _, err = run(["push", str(output_dir), "me/tiny", "--force"], capsys)
    assert code == 0, err
    assert sorted(state.commits[-1][3]) == ["notes/a.txt", "other_model.bin"]
    assert set(state.files("me/tiny")) == MODEL_FILES | TOKENIZER_FILES | {".gitattributes"}


def test_push_command_errors_are_one_line(hub, output_dir, tmp_path, capsys, monkeypatch) -> None:
    """No token, an offline machine, a Hub that cannot be reached, a run folder instead of its model folder: exit 2
    with one line saying what to do, and nothing uploaded."""
    _, state = hub

    def error(argv: list[str]) -> str:
        code, _, err = run(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        return err

    argv = ["push", str(output_dir), "me/tiny"]
    with monkeypatch.context() as patch:
        patch.delenv("HF_TOKEN")
        patch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        patch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        patch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
        err = error(argv)
        assert "no Hugging Face token found" in err and "hf auth login" in err and "HF_TOKEN" in err
    with monkeypatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        assert "this machine is set offline (HF_HUB_OFFLINE=1)" in error(argv)
    with monkeypatch.context() as patch:
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()  # nothing listens there: the connection is refused
        patch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
        err = error(argv)
        assert f"cannot reach the Hub at http://127.0.0.1:{port}" in err and "offline" in err
    run_dir = tmp_path / "run"
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "model" / "config.json").write_text("{}")
    assert f"pass its model folder, {run_dir / 'model'}" in error(["push", str(run_dir), "me/tiny"])
    assert state.commits == [] and state.repos == {}


def test_train_push_to_hub_without_a_token_is_refused_before_training(hub, tmp_path, capsys, monkeypatch) -> None:
    """`train --push-to-hub` where there is no token: exit 2 with one line naming the flag and the fix, before any
    data is read (so before hours of training), no run folder, nothing uploaded."""
    _, state = hub
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))

    def no_data(options: object) -> None:
        raise AssertionError("the training data was read before the token was checked")

    monkeypatch.setattr(train_module, "load_training_data", no_data)
    run_dir = tmp_path / "run"
    argv = ["train", "--max-steps", "2", "--output-dir", str(run_dir), "--push-to-hub", "me/tiny-en-de"]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("hf-vanilla-transformer train: error: `--push-to-hub`: no Hugging Face token found."), err
    assert "Run `hf auth login`, or set HF_TOKEN" in err
    assert not run_dir.exists() and state.commits == [] and state.repos == {}


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("README.md", "has no README.md; write the model card with model_card.write_model_card first"),
        ("model.safetensors", "has no safetensors weights"),
        ("modeling_vanilla_transformer.py", "modeling_vanilla_transformer.py is missing"),
    ],
)
def test_incomplete_folder_is_refused_before_any_upload(hub, output_dir: Path, remove: str, message: str) -> None:
    _, state = hub
    (output_dir / remove).unlink()
    with pytest.raises(ValueError, match=message):
        push_folder_to_hub(output_dir, "me/tiny")
    assert state.commits == [] and state.repos == {}


def test_config_without_auto_map_is_refused(hub, output_dir: Path) -> None:
    config = json.loads((output_dir / "config.json").read_text())
    del config["auto_map"]
    (output_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no auto_map"):
        push_folder_to_hub(output_dir, "me/tiny")
    assert hub[1].repos == {}


def test_save_pretrained_with_push_to_hub_uploads_the_pipeline_file(hub, tmp_path) -> None:
    """`save_pretrained(dir, push_to_hub=True)` uploads what save_pretrained wrote before it returns: the pipeline
    file must be among the code files it copies, not added afterwards (the config's module imports it relatively,
    and transformers copies a custom model's relative imports). The upload holds every code file config.json names,
    and `pipeline("translation", ..., trust_remote_code=True)` of the repository needs that file."""
    _, state = hub
    tiny_model().save_pretrained(tmp_path / "saved", push_to_hub=True, repo_id="me/saved")
    ((repo_id, branch, added, _),) = state.commits
    assert (repo_id, branch) == ("me/saved", "main")
    assert set(added) >= CODE_FILES | {"config.json", "model.safetensors"}, sorted(added)
    assert set(added) == folder_files(tmp_path / "saved"), "the upload is the folder as save_pretrained left it"
    check_config(state.files("me/saved")["config.json"])


@pytest.mark.parametrize("link", ["tokenizer_config.json", "attention"])
def test_a_link_out_of_the_folder_is_refused_naming_it(hub, output_dir, tmp_path_factory, capsys, link) -> None:
    """A symbolic link in the model folder to a file (or folder) outside it: `push` exits 2 with one line naming the
    link and its target, and uploads nothing (before: the target's content went up as the folder's file without a
    word, or a linked folder was left out). A link to a file inside the folder is the folder's own and uploads."""
    _, state = hub
    outside = tmp_path_factory.mktemp("elsewhere")
    (outside / "tokenizer_config.json").write_text('{"secret": "not this model\'s"}')
    (outside / "encoder_attention.png").write_bytes(b"\x89PNG")
    path = output_dir / link
    path.unlink(missing_ok=True)
    path.symlink_to(outside / link if link.endswith(".json") else outside)
    code, _, err = run(["push", str(output_dir), "me/tiny"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    target = outside / link if link.endswith(".json") else outside
    assert f"{path} is a symbolic link to {target.resolve()}, outside the folder" in err, err
    assert state.commits == [] and state.repos == {}
    path.unlink()
    (output_dir / "tokenizer_config.json").unlink(missing_ok=True)
    (output_dir / "copy.json").write_text('{"model_max_length": 64}')
    (output_dir / "tokenizer_config.json").symlink_to(output_dir / "copy.json")
    assert run(["push", str(output_dir), "me/tiny"], capsys)[0] == 0
    assert state.files("me/tiny")["tokenizer_config.json"] == b'{"model_max_length": 64}'
