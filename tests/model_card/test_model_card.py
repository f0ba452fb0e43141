"""Model card: Hub metadata that parses, a license the data allows, and every number taken from the config,
generation config and results."""

import ast
import errno
import json
import re
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard import metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

import model_card
from hf_vanilla_transformer import VanillaTransformerConfig, files, hub_metadata
from hf_vanilla_transformer.inference.attention_maps import plot_attention
from hf_vanilla_transformer.inference.evaluation import evaluate_translations, write_results_json
from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config
from model_card import render_converted_card, source_card_metadata, write_model_card
from model_card.generate import DOMAIN_EXAMPLES, MULTI30K, PROJECT_CITATION, architecture_rows, count_parameters

from ..conftest import tiny_config, tiny_model, tiny_tokenizer

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
    # No license was given and WMT14 is no corpus the card knows the terms of: none is claimed.
    assert "license" not in data
    assert data["tags"] == ["translation", "vanilla-transformer", "attention-is-all-you-need"]
    (model_index,) = metadata_load(path)["model-index"]
    (entry,) = model_index["results"]
    assert entry["task"]["type"] == "translation"
    assert entry["dataset"] == {"name": "WMT14", "type": "wmt/wmt14", "config": "de-en", "split": "test"}
    values = [(metric["type"], metric["value"], metric["config"]) for metric in entry["metrics"]]
    expected = [("bleu", "bleu"), ("bleu", "bleu_lowercase"), ("chrf", "chrf")]
    assert values == [(kind, round(results[key], 2), results[f"{key}_signature"]) for kind, key in expected]
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
    assert "| Maximum output length | source length + 50 |" in text
    assert "Defaults from `generation_config.json`: the paper's §6.1 settings." in text
    assert 'pipeline("translation", model="me/en-de-tiny", trust_remote_code=True)' in text
    assert "import hf_vanilla_transformer" in text and "pip install transformers torch" in text
    assert "hf download me/en-de-tiny --local-dir en-de-tiny" in text
    assert "this folder's name" not in text  # the repo id was given: no note to replace it
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
    assert "## Attention maps" not in text and "The training command and settings were not recorded" in text
    # Without a repo id, the folder's name, with a note to replace it.
    assert f'model="{tmp_path.name}"' in text and "this folder's name" in text


def test_results_without_a_dataset_are_refused(model_dir: Path, results: dict) -> None:
    anonymous = {key: value for key, value in results.items() if key != "dataset"}
    with pytest.raises(ValueError, match=r"pass datasets=\[...\] or set results\['dataset'\]"):
        write_model_card(model_dir, results=anonymous)


def test_parameter_count_of_the_base_model_by_hand() -> None:
    # Embeddings 37000 x 512 (shared, counted once) = 18,944,000. Encoder layer: 4 (512^2 + 512) attention +
    # (512 x 2048 + 2048 + 2048 x 512 + 512) FFN + 2 x 1024 LayerNorm = 3,152,384; x 6 = 18,914,304.
    # Decoder layer: 2 attentions 2,101,248 + FFN 2,099,712 + 3 x 1024 = 4,204,032; x 6 = 25,224,192.
    config = VanillaTransformerConfig.from_preset("transformer-base", vocab_size=37000)
    assert count_parameters(config) == count_parameters(config.to_dict()) == 18_944_000 + 18_914_304 + 25_224_192


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 70},
        {"share_encoder_decoder_embeddings": False, "tie_word_embeddings": False, "lm_head_bias": True},
        {"position_embedding_type": "learned", "position_offset": 2, "normalize_before": True},
        {"add_final_layer_norm": True, "layer_norm_type": "annotated_std", "encoder_layers": 3, "decoder_layers": 1},
        {"encoder_ffn_dim": 48, "decoder_ffn_dim": 80, "tie_word_embeddings": False},
    ],
    ids=["paper", "separate-vocabularies", "untied-biased-head", "learned-offset", "final-norms", "ffn-sizes"],
)
def test_parameter_count_formula_is_the_models(overrides: dict) -> None:
    """The card counts from config.json alone (model_card imports no model code); the model built from the same
    config must have exactly that many parameters, tied matrices once."""
    config = tiny_config(**overrides)
    model = tiny_model(**overrides)
    assert count_parameters(config.to_dict()) == sum(parameter.numel() for parameter in model.parameters())


def test_an_incomplete_config_is_refused_naming_the_fields() -> None:
    config = tiny_config().to_dict()
    del config["d_model"], config["lm_head_bias"]
    with pytest.raises(ValueError, match="lacks d_model, lm_head_bias"):
        architecture_rows(config)


def _imports(path: Path, package: str) -> set[str]:
    """The modules `path` (a module of `package`) imports anywhere in it, relative imports resolved."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return names


def test_model_card_imports_no_module_of_the_package_that_imports_it() -> None:
    """No import circle: model_card takes the package's checks (hub_metadata) and the attention maps' names, and
    none of the package modules it reaches imports model_card (train and hub do, to render)."""
    root = Path(model_card.__file__).parent.parent
    seen: set[str] = set()
    todo = [name for path in Path(model_card.__file__).parent.glob("*.py") for name in _imports(path, "model_card")]
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] != "hf_vanilla_transformer":
            continue
        seen.add(name)
        todo += [name.rsplit(".", count)[0] for count in range(1, name.count(".") + 1)]  # its packages run first
        candidates = (root / f"{name.replace('.', '/')}.py", root / name.replace(".", "/") / "__init__.py")
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is None:  # a name imported from a module, not a module
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        imported = _imports(path, package)
        assert not [module for module in imported if module.split(".")[0] == "model_card"], (name, path)
        todo += imported
    assert "hf_vanilla_transformer.hub_metadata" in seen and "hf_vanilla_transformer.training.train" not in seen


def _no_placeholders(text: str) -> None:
    """No template leftovers and no empty metadata value in a card."""
    assert "{{" not in text and "{%" not in text and "TODO" not in text
    metadata = yaml.safe_load(text.split("---")[1])

    def walk(value: object) -> None:
        assert value not in (None, "", [], {}), metadata
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(metadata)


def _multi30k_results(model_dir: Path, results: dict) -> dict:
    return {key: value for key, value in results.items() if not key.startswith("dataset") and key != "split"} | {
        "dataset": "multi30k",
        "dataset_config": "en-de",
        "split": "test_2016",
        "out_of_domain": {"source": "The Transformer is based solely on attention.", "translation": "w8 w9"},
    }


def test_a_multi30k_card_is_true(model_dir: Path, results: dict) -> None:
    """License: the data's own terms (non-commercial research), never a license the data does not allow; the
    dataset as its Hub id; languages, model-index with signatures, the intended-use and limitations sections with
    the out-of-domain example, the data's citation; the repo id in every usage example."""
    training = {"Preset": "tiny", "Learning rate": 0.0007, "Updates": 12}
    card = write_model_card(
        model_dir,
        results=_multi30k_results(model_dir, results),
        languages=["en", "de"],
        datasets=["multi30k"],
        command=COMMAND,
        repo_id="someone/multi30k-en-de",
        training=training,
    )
    text = card.read_text(encoding="utf-8")
    data = ModelCard(text).data
    assert data.license == "other" and data.license_name == MULTI30K.license_name
    assert data.license_link == "https://github.com/multi30k/dataset"
    assert data.datasets == ["bentrevett/multi30k"] and data.language == ["en", "de"] and data.base_model is None
    assert data.widget == [{"text": DOMAIN_EXAMPLES["en"]}]
    # The model-index round-trips through huggingface_hub, signatures included.
    name, eval_results = model_index_to_eval_results(metadata_load(card)["model-index"])
    assert name == model_dir.name and [result.metric_name for result in eval_results] == [
        "sacreBLEU",
        "BLEU (lowercased)",
        "chrF",
    ]
    assert {result.dataset_type for result in eval_results} == {"bentrevett/multi30k"}
    assert eval_results[0].metric_config == results["bleu_signature"] and eval_results[0].dataset_split == "test_2016"
    assert data.eval_results == eval_results
    # The data README's terms and citation, word for word where the card repeats them.
    readme = (Path(__file__).parents[2] / "hf_vanilla_transformer/data/multi30k/README.md").read_text()
    terms = " ".join(MULTI30K.terms.split())
    assert terms in " ".join(readme.split()) and terms in " ".join(text.split())
    assert "10.18653/v1/W16-3210" in readme and "doi       = {10.18653/v1/W16-3210}" in text
    assert "elliott2017findings" not in text  # the French data's paper only for French
    for section in ("## Intended uses", "## Limitations", "## Training data", "## Training procedure", "## License"):
        assert section in text
    assert 'output: "w8 w9"' in text and "| Learning rate | 0.0007 |" in text and "| Updates | 12 |" in text
    for line in text.splitlines():  # every example loads the real repository
        if "model=" in line or "from_pretrained(" in line:
            assert "someone/multi30k-en-de" in line, line
    assert "hf download someone/multi30k-en-de --local-dir multi30k-en-de" in text
    _no_placeholders(text)


def test_a_given_license_and_base_model(model_dir: Path) -> None:
    path = write_model_card(
        model_dir, languages=["en", "fr"], datasets=["multi30k"], license="cc-by-nc-4.0", base_model="me/base"
    )
    text = path.read_text(encoding="utf-8")
    data = ModelCard(text).data
    assert data.license == "cc-by-nc-4.0" and data.license_name is None and data.base_model == "me/base"
    assert "Fine-tuned from [`me/base`]" in text and MULTI30K.terms in " ".join(text.split())
    assert "elliott2017findings" in text and data.widget == [{"text": DOMAIN_EXAMPLES["en"]}]
    _no_placeholders(text)


def test_a_dataset_that_is_no_hub_id_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"`datasets` entry 'train' is not a Hub dataset id"):
        write_model_card(model_dir, datasets=["train"])


def test_project_citation_matches_citation_cff() -> None:
    cff = yaml.safe_load((Path(__file__).parents[2] / "CITATION.cff").read_text())
    title = re.search(r"title\s*=\s*\{(.*?)\},", PROJECT_CITATION, re.S).group(1)
    assert " ".join(title.split()) == cff["title"]
    assert f"version = {{{cff['version']}}}" in PROJECT_CITATION


def _converted(**options: object) -> str:
    card = render_converted_card(
        "opus: Marian in hf_vanilla_transformer",
        "Converted.",
        {"Source": "a folder"},
        "print(1)",
        source="MarianMTModel",
        **options,
    )
    return str(card)


def test_converted_card_with_and_without_base_model(tmp_path: Path) -> None:
    # The source's own card states its license and languages: the converted card keeps them.
    (tmp_path / "README.md").write_text("---\nlicense: cc-by-4.0\nlanguage: [en, de]\ntags: [x]\n---\n# opus\n")
    source = source_card_metadata(tmp_path)
    assert source == {"license": "cc-by-4.0", "language": ["en", "de"]}
    text = _converted(source_metadata=source, base_model="Helsinki-NLP/opus-mt-en-de")
    data = ModelCard(text).data
    assert data.base_model == "Helsinki-NLP/opus-mt-en-de" and data.license == "cc-by-4.0"
    assert data.language == ["en", "de"] and data.pipeline_tag == "translation"
    assert "Converted from [`Helsinki-NLP/opus-mt-en-de`]" in text and "junczys2018marian" in text
    assert "as the source model's card states it" in text
    _no_placeholders(text)
    # Without --base-model, --license or a source card: nothing is claimed.
    text = _converted()
    data = ModelCard(text).data
    assert data.base_model is None and data.license is None and data.language is None
    assert "The source states no license here" in text and "vaswani2017attention" in text
    _no_placeholders(text)
    # --license wins over the source's card.
    assert ModelCard(_converted(source_metadata=source, license="mit")).data.license == "mit"


# ------------------------------------------------------------------------------------------- issue 34: card values

# What a hostile or careless value looked like in the probe of issue 34: each landed in the card's front matter or
# body (a second YAML key, raw <script>, a 5,000-character language).
BAD_LANGUAGES = ["en\nlicense: mit", "<script>alert(1)</script>", "x" * 5000, "English", "EN", "en_US", ""]
BAD_LICENSES = ["mit\nbase_model: x", "MIT", "<b>mit</b>", "apache 2.0", "gpl-4.0", ""]


def test_hub_licenses_are_the_hubs_list() -> None:
    """HUB_LICENSES is the Hub's table (docs/hub/repositories-licenses): the ids the brief of issue 34 names are in
    it, each once, as the Hub writes them (lowercase, no spaces), `other` last."""
    ids = hub_metadata.HUB_LICENSES
    named = ["apache-2.0", "mit", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "gpl-3.0", "bsd-3-clause", "openrail"]
    assert {*named, "llama2", "cc0-1.0", "agpl-3.0", "unknown", "other"} <= set(ids)
    assert len(ids) == len(set(ids)) and ids[-1] == "other"
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license) for license in ids)


@pytest.mark.parametrize("language", BAD_LANGUAGES)
def test_a_language_the_hub_would_not_take_is_refused(model_dir: Path, language: str) -> None:
    with pytest.raises(ValueError, match=r"^`languages` .* is not a language tag the Hub accepts\. (Pass|Write)"):
        write_model_card(model_dir, languages=["en", language])
    with pytest.raises(ValueError, match=r"is not a language tag the Hub accepts"):
        _converted(languages=[language])


@pytest.mark.parametrize("license", BAD_LICENSES)
def test_a_license_that_is_no_hub_id_is_refused(model_dir: Path, license: str) -> None:
    with pytest.raises(ValueError, match=r"^`license` .* is not a license id of the Hub"):
        write_model_card(model_dir, languages=["en", "de"], license=license)
    with pytest.raises(ValueError, match=r"is not a license id of the Hub"):
        _converted(license=license)


def test_bcp47_tags_other_with_a_name_and_a_bad_base_model(model_dir: Path) -> None:
    """Tags with a script or region are taken: the Hub's `language` field gets their ISO 639 part, `language_bcp47`
    the tags; `license: other` needs `license_name` and shows it; a base model that is no Hub id is refused."""
    path = write_model_card(model_dir, languages=["pt-BR", "zh-Hant"], license="other", license_name="my-terms-1.0")
    text = path.read_text(encoding="utf-8")
    data = ModelCard(text).data
    assert data.language == ["pt", "zh"] and data.to_dict()["language_bcp47"] == ["pt-BR", "zh-Hant"]
    assert (data.license, data.license_name) == ("other", "my-terms-1.0")
    assert "`other` (`my-terms-1.0`), as given by whoever trained the model" in text
    assert "pt-BR → zh-Hant" in text
    assert "language_bcp47" not in ModelCard(write_model_card(model_dir, languages=["eng", "deu"]).read_text()).data
    with pytest.raises(ValueError, match=r"`license=other` needs `license_name`"):
        write_model_card(model_dir, languages=["en", "de"], license="other")
    with pytest.raises(ValueError, match=r"`license_name` 'mine' names the terms of `license=other` only"):
        write_model_card(model_dir, languages=["en", "de"], license="mit", license_name="mine")
    with pytest.raises(ValueError, match=r"`base_model` '<script>' is not a Hub repository id"):
        write_model_card(model_dir, languages=["en", "de"], base_model="<script>")


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (
            "hf-vanilla-transformer train --train-src /home/u/data/train.en --train-tgt /home/u/data/train.de",
            "hf-vanilla-transformer train --train-src train.en --train-tgt train.de",
        ),
        ("x --tokenizer ~/tok --init-from=/srv/runs/a/model", "x --tokenizer tok --init-from=model"),
        (
            "x --test-src ../../secret/test.en --config 'C:\\Users\\u\\run.yaml'",
            "x --test-src test.en --config run.yaml",
        ),
        ("x --output-dir 'outputs/my run' --dataset wmt/wmt14", "x --output-dir 'outputs/my run' --dataset wmt/wmt14"),
    ],
    ids=["absolute", "home-and-equals", "climbing-and-windows", "relative-and-hub-ids-stay"],
)
def test_the_card_shows_file_names_for_local_paths(model_dir: Path, command: str, shown: str) -> None:
    """The reproduced training command and the training table show file names for local paths, never the
    machine's folders (a pushed card disclosed /home/...); relative paths below the run and Hub ids stay."""
    assert hub_metadata.public_command(command) == shown
    training = {"Tokenizer": "/home/u/tokenizers/bpe-8k", "Preset": "transformer-base"}
    text = write_model_card(model_dir, languages=["en", "de"], command=command, training=training).read_text()
    assert f"```bash\n{shown}\n```" in text and "| Tokenizer | bpe-8k |" in text
    assert "/home/u" not in text and "/srv/" not in text and "secret" not in text and "Users" not in text


def test_a_converted_card_keeps_only_what_the_hub_takes_of_the_source_card(tmp_path: Path) -> None:
    """The source's own card (a downloaded folder's README.md) is read, not trusted: a language or license there
    that the Hub would not take is left out of the converted card, the valid ones kept."""
    (tmp_path / "README.md").write_text(
        "---\nlicense: 'mit\n\n  base_model: x'\nlanguage: [en, '<script>x</script>', multilingual]\n---\n# opus\n"
    )
    data = ModelCard(_converted(source_metadata=source_card_metadata(tmp_path))).data
    assert data.language == ["en", "multilingual"] and data.license is None
    other = {"license": "other", "license_name": "opus-terms", "license_link": "https://opus.example/terms"}
    data = ModelCard(_converted(source_metadata=other)).data
    assert (data.license, data.license_name, data.license_link) == (
        "other",
        "opus-terms",
        "https://opus.example/terms",
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--license", "mit\nbase_model: x"], "`--license` 'mit\\nbase_model: x' is not a license id of the Hub"),
        (["--license", "other"], "`--license other` needs `--license-name`"),
        (["--base-model", "<script>"], "`--base-model` '<script>' is not a Hub repository id"),
    ],
)
def test_conversion_card_options_are_refused_before_the_source_is_read(flags, message, tmp_path, capsys) -> None:
    """`python -m conversion`'s card options are checked as the options are built: one line naming the flag, exit
    2, before the (here missing) source is looked at."""
    from conversion.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["marian", str(tmp_path / "missing"), str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_train_options_take_bcp47_tags_and_refuse_the_rest(tmp_path: Path) -> None:
    """`check_report_values` (train's check_options): the card's languages and license as the Hub takes them."""
    from hf_vanilla_transformer.errors import OptionError
    from hf_vanilla_transformer.training.options import TrainOptions, check_report_values

    check_report_values(TrainOptions(src_lang="pt-BR", tgt_lang="zh-Hant", license="other", license_name="x-1"))
    check_report_values(TrainOptions(src_lang="eng", tgt_lang="deu", license="cc-by-nc-4.0"))
    with pytest.raises(OptionError, match=r"^`tgt_lang` '<script>alert\(1\)</script>' is not a language tag"):
        check_report_values(TrainOptions(tgt_lang="<script>alert(1)</script>"))
    with pytest.raises(OptionError, match=r"^`license_name` 'x' names the terms of `license=other` only"):
        check_report_values(TrainOptions(license_name="x"))
    with pytest.raises(OptionError, match=r"^`test_max_sentences=0` must be a positive whole number"):
        check_report_values(TrainOptions(test_max_sentences=0))
    with pytest.raises(OptionError, match=r"^`num_beams=0` must be a positive whole number, or None for §6.1's 4"):
        check_report_values(TrainOptions(num_beams=0))
    for alpha in (float("nan"), float("inf"), "1.0", True):
        with pytest.raises(
            OptionError, match=r"^`length_penalty` must be a number from -5 to 5 \(the paper's is 0.6\)"
        ):
            check_report_values(TrainOptions(length_penalty=alpha))
    check_report_values(TrainOptions(num_beams=8, length_penalty=-0.5))


def test_train_checks_languages_and_license_without_model_card(monkeypatch) -> None:
    """The languages and license are checked by the package itself: with model_card unimportable (jinja2 missing),
    a bad tag is still refused (before: the checks were skipped when `from model_card import ...` failed)."""
    import sys

    from hf_vanilla_transformer.errors import OptionError
    from hf_vanilla_transformer.training.options import TrainOptions, check_report_values, public_command_line

    monkeypatch.setitem(sys.modules, "model_card", None)  # `import model_card` raises ImportError
    with pytest.raises(OptionError, match=r"^`src_lang` 'en\\nlicense: mit' is not a language tag the Hub accepts"):
        check_report_values(TrainOptions(src_lang="en\nlicense: mit"))
    with pytest.raises(OptionError, match=r"^`license` 'MIT' is not a license id of the Hub"):
        check_report_values(TrainOptions(license="MIT"))
    assert public_command_line("x --train-src /home/u/train.en") == "x --train-src train.en"


def test_a_full_disk_while_writing_the_card_leaves_the_old_card(tmp_path, monkeypatch) -> None:
    """The card is written beside README.md and renamed over it once whole: a write that fails half-way (ENOSPC)
    leaves the old card as it was and no partial file (before: a cut README.md that looked complete). A partial
    file a kill leaves behind is a writer's temporary file, not a file of the user's that would block the folder."""
    tiny_model().save_pretrained(tmp_path)
    old = write_model_card(tmp_path).read_text()

    def full_disk(card: ModelCard, filepath: Path) -> None:
        Path(filepath).write_text(str(card)[:100])
        raise OSError(errno.ENOSPC, "No space left on device", str(filepath))

    monkeypatch.setattr(ModelCard, "save", full_disk)
    with pytest.raises(OSError) as error:
        write_model_card(tmp_path, languages=["en", "fr"])
    assert error.value.errno == errno.ENOSPC
    assert (tmp_path / "README.md").read_text() == old
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".README")]
    (tmp_path / ".README.md.partial-12345").write_text("cut")
    assert files.foreign_entries(tmp_path, files.MODEL_LAYOUT) == []
