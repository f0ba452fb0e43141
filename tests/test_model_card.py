"""Model card: Hub metadata that parses, and every number taken from the config, generation config and results."""

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard import metadata_load

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.attention_maps import plot_attention
from hf_vanilla_transformer.evaluation import evaluate_translations, write_results_json
from hf_vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from model_card import write_model_card
from model_card.generate import count_parameters

from .conftest import tiny_model, tiny_tokenizer

COMMAND = "hf-vanilla-transformer train --preset transformer-base --max-tokens 25000 --output-dir runs/base"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved model with paper decoding, its tokenizer and attention maps; the decoder is shallower on purpose."""
    directory = tmp_path_factory.mktemp("en-de-tiny")
    model, tokenizer = tiny_model(decoder_layers=1), tiny_tokenizer()
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    plot_attention(model, tokenizer, "w5 w6 w7", "w8 w9", out_dir=directory / "attention")
    return directory


@pytest.fixture(scope="module")
def results() -> dict:
    model = tiny_model(seed=3, init_std=1.0)
    sources, references = ["w5 w6 w7 w8", "w9 w10", "w11 w12 w13"], ["w12 w12 w40", "w12 w8", "w47 w12 w9"]
    scores = evaluate_translations(
        model, tiny_tokenizer(), sources, references, generation_kwargs={"max_new_tokens": 4}
    )
    return scores | {"dataset": "wmt/wmt14", "dataset_config": "de-en", "split": "test", "dataset_name": "WMT14"}


def test_metadata_parses_and_carries_the_scores(model_dir: Path, results: dict) -> None:
    path = write_model_card(model_dir, None, results, ["en", "de"], ["wmt/wmt14"], COMMAND, repo_id="me/en-de-tiny")
    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "translation"
    assert data["language"] == ["en", "de"] and data["datasets"] == ["wmt/wmt14"]
    assert data["license"] == "apache-2.0"
    assert data["tags"] == ["vanilla-transformer", "attention-is-all-you-need"]
    (model_index,) = metadata_load(path)["model-index"]
    (entry,) = model_index["results"]
    assert entry["task"]["type"] == "translation"
    assert entry["dataset"] == {"name": "WMT14", "type": "wmt/wmt14", "config": "de-en", "split": "test"}
    values = [(metric["type"], metric["value"]) for metric in entry["metrics"]]
    expected = [("bleu", results["bleu"]), ("bleu", results["bleu_lowercase"]), ("chrf", results["chrf"])]
    assert values == [(kind, round(value, 2)) for kind, value in expected]
    assert 0 < results["chrf"]  # a real score, not a placeholder
    text = card.text
    assert f"| BLEU (sacreBLEU: detokenized, cased, 13a) | {round(results['bleu'], 2)} |" in text
    assert results["bleu_signature"].replace("|", "\\|") in text
    assert f"{results['n']} sentences of WMT14 (de-en), test split" in text


def test_body_is_filled_from_the_saved_files(model_dir: Path, results: dict) -> None:
    write_results_json(model_dir / "results.json", results)
    path = write_model_card(
        model_dir,
        results=model_dir / "results.json",
        datasets=["wmt/wmt14"],
        command=COMMAND,
        extra="## Notes\n\nA tiny test model.",
        repo_id="me/en-de-tiny",
    )
    text = path.read_text(encoding="utf-8")
    config = json.loads((model_dir / "config.json").read_text())
    assert f"| Layers N (encoder / decoder) | {config['encoder_layers']} / {config['decoder_layers']} | 6 |" in text
    assert f"| d_model | {config['d_model']} | 512 |" in text
    assert f"| d_ff | {config['encoder_ffn_dim']} | 2048 |" in text
    parameters = sum(parameter.numel() for parameter in tiny_model(decoder_layers=1).parameters())
    assert f"| Parameters | {parameters:,} | 65M |" in text
    assert "| Maximum output length | source length + 50 |" in text and "the paper's §6.1 settings" in text
    assert 'pipeline("translation", model="me/en-de-tiny", trust_remote_code=True)' in text
    assert "import hf_vanilla_transformer" in text
    assert f"```bash\n{COMMAND}\n```" in text and "## Notes\n\nA tiny test model." in text
    for name in ("encoder_self_attention", "decoder_self_attention", "cross_attention"):
        assert f"](attention/{name}.png)" in text and (model_dir / "attention" / f"{name}.png").is_file()


def test_card_without_results_or_generation_config(tmp_path: Path) -> None:
    tiny_model().save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    path = write_model_card(tmp_path, languages=["en", "fr"])
    assert "model-index" not in metadata_load(path)
    text = path.read_text(encoding="utf-8")
    assert "No evaluation results" in text and "uses transformers' defaults" in text
    assert "## Attention maps" not in text and "## Training" not in text


def test_results_without_a_dataset_are_refused(model_dir: Path, results: dict) -> None:
    anonymous = {key: value for key, value in results.items() if key != "dataset"}
    with pytest.raises(ValueError, match=r"pass datasets=\[...\] or set results\['dataset'\]"):
        write_model_card(model_dir, results=anonymous)


def test_parameter_count_of_the_base_model_by_hand() -> None:
    # Embeddings 37000 x 512 (shared, counted once) = 18,944,000. Encoder layer: 4 (512^2 + 512) attention +
    # (512 x 2048 + 2048 + 2048 x 512 + 512) FFN + 2 x 1024 LayerNorm = 3,152,384; x 6 = 18,914,304.
    # Decoder layer: 2 attentions 2,101,248 + FFN 2,099,712 + 3 x 1024 = 4,204,032; x 6 = 25,224,192.
    config = VanillaTransformerConfig.from_preset("transformer-base", vocab_size=37000)
    assert count_parameters(config) == 18_944_000 + 18_914_304 + 25_224_192
