"""Uploading to the Hub, against an in-memory fake of the Hub API (create_repo / create_commit / card download);
opening any network connection fails the test."""

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError

from hf_vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from model_card import push_folder_to_hub, write_model_card

from .conftest import CODE_FILES, tiny_model, tiny_tokenizer

TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}
MODEL_FILES = {"model.safetensors", "config.json", "generation_config.json", "README.md"} | CODE_FILES


class FakeHub:
    """Repositories as {repo_id: {path: bytes}}, and each commit's paths."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[tuple[str, list[str]]] = []

    def create_repo(self, repo_id: str, **kwargs: object) -> SimpleNamespace:
        self.repos.setdefault(repo_id, {})
        return SimpleNamespace(repo_id=repo_id)

    def create_commit(self, repo_id: str, operations: list, **kwargs: object) -> SimpleNamespace:
        if repo_id not in self.repos:
            raise AssertionError(f"commit to {repo_id} before create_repo")
        paths = []
        for operation in operations:
            assert isinstance(operation, CommitOperationAdd), operation
            source = operation.path_or_fileobj
            if isinstance(source, (str, Path)):
                content = Path(source).read_bytes()
            elif isinstance(source, bytes):
                content = source
            else:
                content = source.read()
            self.repos[repo_id][operation.path_in_repo] = content
            paths.append(operation.path_in_repo)
        self.commits.append((repo_id, paths))
        return SimpleNamespace(commit_url=f"fake://{repo_id}/commit/{len(self.commits)}")

    def load_card(self, repo_id: str, **kwargs: object) -> ModelCard:
        if "README.md" not in self.repos.get(repo_id, {}):
            raise EntryNotFoundError(f"{repo_id} has no README.md")
        return ModelCard(self.repos[repo_id]["README.md"].decode())


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    fake = FakeHub()

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    # Bound methods as class attributes: `api.create_repo(...)` calls `fake.create_repo(...)`, without the HfApi.
    monkeypatch.setattr(HfApi, "create_repo", fake.create_repo)
    monkeypatch.setattr(HfApi, "create_commit", fake.create_commit)
    monkeypatch.setattr(ModelCard, "load", fake.load_card)
    return fake


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    """A finished training folder: model, tokenizer, card, plus files that must stay local."""
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


def test_push_folder_uploads_exactly_the_hub_files(hub: FakeHub, output_dir: Path) -> None:
    push_folder_to_hub(output_dir, "me/tiny")
    ((repo_id, paths),) = hub.commits
    assert repo_id == "me/tiny"
    assert set(paths) == MODEL_FILES | TOKENIZER_FILES and len(paths) == len(set(paths))
    files = hub.repos["me/tiny"]
    for path in paths:
        assert files[path] == (output_dir / path).read_bytes()
    check_config(files["config.json"])
    assert json.loads(files["generation_config.json"])["length_penalty_type"] == "gnmt"
    card = ModelCard(files["README.md"].decode())
    assert card.data.pipeline_tag == "translation" and "vanilla-transformer" in card.data.tags


def test_model_and_tokenizer_push_to_hub(hub: FakeHub) -> None:
    model = tiny_model()
    model.push_to_hub("me/pushed")
    tiny_tokenizer().push_to_hub("me/pushed")
    (_, model_paths), (_, tokenizer_paths) = hub.commits
    assert set(model_paths) == MODEL_FILES
    assert set(tokenizer_paths) == TOKENIZER_FILES | {"README.md"}
    check_config(hub.repos["me/pushed"]["config.json"])


def test_push_to_hub_after_the_folder_keeps_our_card(hub: FakeHub, output_dir: Path) -> None:
    push_folder_to_hub(output_dir, "me/tiny")
    ours = ModelCard(hub.repos["me/tiny"]["README.md"].decode())
    tiny_model().push_to_hub("me/tiny")  # transformers loads the existing card and only adds tags
    after = ModelCard(hub.repos["me/tiny"]["README.md"].decode())
    assert after.text == ours.text and after.data.pipeline_tag == "translation"


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("README.md", "has no README.md; write the model card with model_card.write_model_card first"),
        ("model.safetensors", "has no safetensors weights"),
        ("modeling_vanilla_transformer.py", "modeling_vanilla_transformer.py is missing"),
    ],
)
def test_incomplete_folder_is_refused_before_any_upload(
    hub: FakeHub, output_dir: Path, remove: str, message: str
) -> None:
    (output_dir / remove).unlink()
    with pytest.raises(ValueError, match=message):
        push_folder_to_hub(output_dir, "me/tiny")
    assert hub.commits == [] and hub.repos == {}


def test_config_without_auto_map_is_refused(hub: FakeHub, output_dir: Path) -> None:
    config = json.loads((output_dir / "config.json").read_text())
    del config["auto_map"]
    (output_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no auto_map"):
        push_folder_to_hub(output_dir, "me/tiny")
