"""Write a Hub model card (README.md) for a saved model folder from its real files; the card of a converted
checkpoint (`render_converted_card`, used by `python -m conversion`) comes from here too. Uploading the folder is
hf_vanilla_transformer.hub's.

Every number in the card comes from an input: the architecture table and parameter count from config.json (or the
config passed), the decoding table from generation_config.json, the scores from the results dict / JSON written by
`hf_vanilla_transformer.inference.evaluation.write_results_json`; attention maps are the folder's `attention/*.png`
(as written by `hf-vanilla-transformer attention MODEL_DIR "..." --out MODEL_DIR/attention`). Nothing is typed by hand.

This package works from plain data (config.json as a dict, the folder's files). The values a card writes are checked
by `hf_vanilla_transformer.hub_metadata` (the same checks `train` makes before any data is read); the package's
`train` and `push` import this one only inside the functions that render a card, and no module of the package that
this one imports imports it back (tests/model_card/test_model_card.py checks both). The parameter count's formula,
which it restates, is checked against the model by tests/model_card/test_model_card.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PretrainedConfig

from hf_vanilla_transformer.hub_metadata import (
    HUB_LANGUAGE_WORDS,
    check_language,
    check_license,
    check_repo_id,
    hub_language,
    public_command,
    public_path,
)
from hf_vanilla_transformer.inference.attention_maps import ATTENTION_DIR, PLOTS

TEMPLATE = Path(__file__).with_name("template.md")
CONVERTED_TEMPLATE = Path(__file__).with_name("converted_template.md")
TAGS = ["vanilla-transformer", "attention-is-all-you-need"]
CONVERTED_TAGS = ["vanilla-transformer", "converted"]
# Image-description sentences (the domain of Multi30k, written for the card, not taken from its splits) for the
# widget and the usage examples, by source language; other languages use the first test source (the workflow
# passes it) or English.
DOMAIN_EXAMPLES = {
    "en": "A little girl in a red dress is running along the beach with her dog.",
    "de": "Ein kleines Mädchen in einem roten Kleid läuft mit ihrem Hund am Strand entlang.",
    "fr": "Une petite fille en robe rouge court sur la plage avec son chien.",
}
PAPER_CITATION = r"""@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, {\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {30},
  pages     = {5998--6008},
  year      = {2017},
  url       = {https://arxiv.org/abs/1706.03762}
}"""
# CITATION.cff's software entry (tests/model_card/test_model_card.py checks the title and version against it).
PROJECT_CITATION = """@software{hf_vanilla_transformer,
  title   = {hf_vanilla_transformer: the Transformer of 'Attention Is All You Need' as a native Hugging Face
             seq2seq model},
  author  = {The hf_vanilla_transformer authors},
  version = {0.1.0},
  license = {Apache-2.0}
}"""
# Citations of the toolkits converters read, by the `source` name a converter's check gives.
TOOLKIT_CITATIONS = {
    "fairseq": """@inproceedings{ott2019fairseq,
  title     = {fairseq: A Fast, Extensible Toolkit for Sequence Modeling},
  author    = {Ott, Myle and Edunov, Sergey and Baevski, Alexei and Fan, Angela and Gross, Sam and Ng, Nathan and
               Grangier, David and Auli, Michael},
  booktitle = {Proceedings of NAACL-HLT 2019: Demonstrations},
  pages     = {48--53},
  year      = {2019},
  doi       = {10.18653/v1/N19-4009}
}""",
    "OpenNMT-py": """@inproceedings{klein2017opennmt,
  title     = {{OpenNMT}: Open-Source Toolkit for Neural Machine Translation},
  author    = {Klein, Guillaume and Kim, Yoon and Deng, Yuntian and Senellart, Jean and Rush, Alexander},
  booktitle = {Proceedings of ACL 2017, System Demonstrations},
  pages     = {67--72},
  year      = {2017},
  doi       = {10.18653/v1/P17-4012}
}""",
    "MarianMTModel": r"""@inproceedings{junczys2018marian,
  title     = {Marian: Fast Neural Machine Translation in {C++}},
  author    = {Junczys-Dowmunt, Marcin and Grundkiewicz, Roman and Dwojak, Tomasz and Hoang, Hieu and Heafield, Kenneth
               and Neckermann, Tom and Seide, Frank and Germann, Ulrich and Aji, Alham Fikri and Bogoychev, Nikolay and
               Martins, Andr{\'e} F. T. and Birch, Alexandra},
  booktitle = {Proceedings of ACL 2018, System Demonstrations},
  pages     = {116--121},
  year      = {2018},
  doi       = {10.18653/v1/P18-4020}
}""",
}


def _source_license(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The license fields of a source model's card where the Hub takes them (with the link of `other`), else {}."""
    try:
        fields = check_license(metadata.get("license"), metadata.get("license_name"))
    except ValueError:
        return {}
    link = metadata.get("license_link")
    if fields["license"] == "other" and isinstance(link, str) and re.fullmatch(r"https?://\S+", link):
        fields["license_link"] = link
    return fields


def _card_languages(languages: Sequence[str], source: str) -> dict[str, list[str]]:
    """The card's language fields for `languages` (each checked, `source` naming where they come from): `language`
    holds each tag's ISO 639 part, as the Hub's field takes it, and `language_bcp47` the tags, where any has more
    (a script or a region)."""
    tags = [word if word in HUB_LANGUAGE_WORDS else check_language(word, source) for word in languages]
    if not tags:
        return {}
    fields = {"language": list(dict.fromkeys(tag.split("-")[0] for tag in tags))}
    if any("-" in tag for tag in tags):
        fields["language_bcp47"] = tags
    return fields


@dataclass(frozen=True)
class TrainingData:
    """What the card says about a known training corpus: its Hub dataset id, its terms (as the Hub's `license:
    other` with `license_name` / `license_link` when they are no standard license), its domain, and citations."""

    name: str
    hub_id: str | None
    description: str
    domain: str
    terms: str
    license_name: str
    license_link: str
    citations: dict[str, str]  # bibtex by the language it covers ("" = all)


# The bundled Multi30k; its terms and citations as hf_vanilla_transformer/data/multi30k/README.md states them.
MULTI30K = TrainingData(
    name="Multi30k",
    hub_id="bentrevett/multi30k",
    description=(
        "[Multi30k](https://github.com/multi30k/dataset) (task 1): 29,000 English descriptions of Flickr30K images "
        "with German (and French) translations; the model was tested on `test_2016_flickr` (1,000 sentences). "
        "The same data is on the Hub as [`bentrevett/multi30k`](https://huggingface.co/datasets/bentrevett/multi30k)."
    ),
    domain="short descriptions of everyday photographs (people, animals, streets, sports)",
    terms=(
        "Multi30K is partially derived from Flickr30K; it is provided for non-commercial research and educational use."
    ),
    license_name="multi30k-non-commercial-research",
    license_link="https://github.com/multi30k/dataset",
    citations={
        "": r"""@inproceedings{elliott2016multi30k,
  title     = {Multi30{K}: Multilingual {E}nglish-{G}erman Image Descriptions},
  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  pages     = {70--74},
  year      = {2016},
  doi       = {10.18653/v1/W16-3210}
}""",
        "fr": r"""@inproceedings{elliott2017findings,
  title     = {Findings of the Second Shared Task on Multimodal Machine Translation and Multilingual Image
               Description},
  author    = {Elliott, Desmond and Frank, Stella and Barrault, Lo{\"\i}c and Bougares, Fethi and Specia, Lucia},
  booktitle = {Proceedings of the Second Conference on Machine Translation (WMT 2017)},
  year      = {2017}
}""",
    },
)
KNOWN_DATA = {"multi30k": MULTI30K, MULTI30K.hub_id: MULTI30K}

# The grids `hf-vanilla-transformer attention` writes (file stem, title), in the card's order; other images in
# attention/ follow them.
ATTENTION_MAPS = tuple((stem, title) for stem, title, *_ in PLOTS)
# The config.json fields the architecture table and the parameter count read.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "scale_embedding",
    "share_encoder_decoder_embeddings",
    "tie_word_embeddings",
    "lm_head_bias",
    "max_position_embeddings",
    "position_embedding_type",
    "sinusoidal_layout",
    "position_offset",
    "normalize_before",
    "add_final_layer_norm",
    "layer_norm_eps",
)


# A model config as the card reads it: config.json's dict, or a config object (its `to_dict()`).
CardConfig = Mapping[str, Any] | PretrainedConfig


def architecture(config: CardConfig) -> dict[str, Any]:
    """The config as a dict holding every field of ARCHITECTURE_FIELDS (config.json of a saved model holds them
    all); raises ValueError naming the missing ones."""
    settings = config.to_dict() if isinstance(config, PretrainedConfig) else dict(config)
    missing = [name for name in ARCHITECTURE_FIELDS if name not in settings]
    if missing:
        raise ValueError(
            f"The model config lacks {', '.join(missing)}: the card describes a complete vanilla_transformer "
            "config. Pass the config.json that save_pretrained writes, or config.to_dict()."
        )
    return settings


def _config(output_dir: Path, config: CardConfig | None) -> dict[str, Any]:
    if config is None:
        path = output_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"No config given and no {path}. Save the model there first, or pass `config`.")
        config = json.loads(path.read_text(encoding="utf-8"))
    return architecture(config)


def count_parameters(config: CardConfig) -> int:
    """Parameters of the model `config` describes, tied matrices once, by the model's layout (modeling's
    modules: embeddings, learned position tables per stack, 4 attention projections with biases, the FFN's two
    linears, 2 LayerNorms per encoder layer and 3 per decoder layer, the final ones, the output layer)."""
    c = architecture(config)
    d = c["d_model"]

    def linear(inputs: int, outputs: int) -> int:
        return inputs * outputs + outputs

    attention, norm = 4 * linear(d, d), 2 * d
    encoder_layer = attention + linear(d, c["encoder_ffn_dim"]) + linear(c["encoder_ffn_dim"], d) + 2 * norm
    decoder_layer = 2 * attention + linear(d, c["decoder_ffn_dim"]) + linear(c["decoder_ffn_dim"], d) + 3 * norm
    layers = c["encoder_layers"] * encoder_layer + c["decoder_layers"] * decoder_layer
    final_norms = 2 * norm if c["add_final_layer_norm"] else 0
    vocab, decoder_vocab = c["vocab_size"], c["decoder_vocab_size"]
    embeddings = vocab * d if c["share_encoder_decoder_embeddings"] else (vocab + decoder_vocab) * d
    positions = 0
    if c["position_embedding_type"] == "learned":  # one table per stack, rows shifted by the offset
        positions = 2 * (c["max_position_embeddings"] + c["position_offset"]) * d
    output = (0 if c["tie_word_embeddings"] else decoder_vocab * d) + (decoder_vocab if c["lm_head_bias"] else 0)
    return embeddings + positions + layers + final_norms + output


def architecture_rows(config: CardConfig) -> list[tuple[str, str, str]]:
    """(setting, this model, paper base model) rows, §3 and Table 3."""
    c = architecture(config)

    def pair(encoder: object, decoder: object) -> str:
        return f"{encoder}" if encoder == decoder else f"{encoder} / {decoder}"

    share, tie = c["share_encoder_decoder_embeddings"], c["tie_word_embeddings"]
    tying = {
        (True, True): "three-way (both embeddings and output layer)",
        (True, False): "source and target embeddings only",
        (False, True): "target embedding and output layer",
        (False, False): "none",
    }[share, tie]
    if c["position_embedding_type"] == "sinusoidal":
        positions = f"sinusoidal, {c['sinusoidal_layout']}"
    else:
        positions = "learned"
    if c["position_offset"]:
        positions += f", offset {c['position_offset']}"
    norm = "pre-LN" if c["normalize_before"] else "post-LN"
    if c["add_final_layer_norm"]:
        norm += ", final LayerNorm per stack"
    vocab = f"{c['vocab_size']} shared" if share else f"{c['vocab_size']} / {c['decoder_vocab_size']}"
    parameters = count_parameters(c)
    return [
        ("Layers N (encoder / decoder)", pair(c["encoder_layers"], c["decoder_layers"]), "6"),
        ("d_model", str(c["d_model"]), "512"),
        ("Heads h", pair(c["encoder_attention_heads"], c["decoder_attention_heads"]), "8"),
        (
            "d_k = d_v",
            pair(c["d_model"] // c["encoder_attention_heads"], c["d_model"] // c["decoder_attention_heads"]),
            "64",
        ),
        ("d_ff", pair(c["encoder_ffn_dim"], c["decoder_ffn_dim"]), "2048"),
        ("Activation", c["activation_function"], "relu"),
        ("Dropout P_drop", f"{c['dropout']:g}", "0.1"),
        (
            "Attention / activation dropout",
            f"{c['attention_dropout']:g} / {c['activation_dropout']:g}",
            "none",
        ),
        ("Vocabulary", vocab, "~37000 shared BPE (EN-DE)"),
        ("Weight tying (§3.4)", tying, "three-way"),
        ("Embeddings × √d_model (§3.4)", "yes" if c["scale_embedding"] else "no", "yes"),
        ("Positional encoding (§3.5)", positions, "sinusoidal, interleaved"),
        ("Layer normalization (§3.1)", norm, "post-LN"),
        ("LayerNorm ε", f"{c['layer_norm_eps']:g}", "not given"),
        ("Output-layer bias", "yes" if c["lm_head_bias"] else "no", "no"),
        ("Parameters", f"{parameters / 1e6:.1f}M ({parameters:,})" if parameters >= 1e6 else f"{parameters:,}", "65M"),
    ]


def decoding_rows(generation: Mapping[str, Any]) -> tuple[list[tuple[str, str]], bool]:
    """Rows of the decoding table from generation_config.json, and whether they are the paper's §6.1 settings."""
    beams = generation.get("num_beams") or 1
    alpha = generation.get("length_penalty", 1.0)
    penalty = generation.get("length_penalty_type") or "hf"
    offset = generation.get("max_new_tokens_offset")
    if offset is not None:
        limit = f"source length + {offset}"
    elif generation.get("max_new_tokens") is not None:
        limit = f"{generation['max_new_tokens']} new tokens"
    elif generation.get("max_length") is not None:
        limit = f"{generation['max_length']} tokens"
    else:  # generate() then applies §6.1's limit (PAPER_MAX_NEW_TOKENS_OFFSET), not transformers' 20 tokens
        limit = "source length + 50"
    early = generation.get("early_stopping", False)
    rows = [
        ("Beam size", str(beams)),
        ("Length penalty α", f"{alpha:g}"),
        ("Length penalty formula", "GNMT ((5 + |Y|) / 6)^α" if penalty == "gnmt" else "transformers |Y|^α"),
        ("Maximum output length", limit),
        ("Early stopping", str(early)),
    ]
    paper = beams == 4 and alpha == 0.6 and penalty == "gnmt" and offset == 50 and early is True
    return rows, paper


def _results(results: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    if results is None:
        return None
    if isinstance(results, Mapping):
        return dict(results)
    return json.loads(Path(results).read_text(encoding="utf-8"))


def _hub_datasets(datasets: Sequence[str]) -> list[str]:
    """`datasets` as Hub dataset ids: a known corpus's short name ("multi30k") becomes its id; anything else must
    already be one ("owner/name")."""
    ids = []
    for name in datasets:
        known = KNOWN_DATA.get(name)
        hub_id = known.hub_id if known is not None else name
        if hub_id is None or not re.fullmatch(r"[\w.-]+/[\w.-]+", hub_id):
            raise ValueError(
                f"`datasets` entry {name!r} is not a Hub dataset id (owner/name). Pass Hub ids only, or describe "
                "other data with `data_note`."
            )
        ids.append(hub_id)
    return ids


def _license(license: str | None, license_name: str | None, data: Sequence[TrainingData]) -> dict[str, str]:
    """The Hub license fields: the user's `license` (with `license_name` for `other`; `check_license`), else the
    terms of the known training data (`license: other` with their name and link, since they are no standard
    license), else none: a card must not claim a license that nobody stated."""
    if license is not None or license_name is not None:
        return check_license(license, license_name)
    if data:
        return {"license": "other", "license_name": data[0].license_name, "license_link": data[0].license_link}
    return {}


def _citations(data: Sequence[TrainingData], languages: Sequence[str]) -> list[str]:
    """The bibtex entries of the training data that cover `languages`."""
    return [bibtex for corpus in data for language, bibtex in corpus.citations.items() if language in ("", *languages)]


def _eval_results(results: dict[str, Any], task_name: str) -> list[EvalResult]:
    """The model-index entries of one test set: sacreBLEU, lowercased BLEU and chrF, each with its sacreBLEU
    signature as `metric_config`, so that the Hub's structured scores say exactly what was computed."""
    common = dict(
        task_type="translation",
        task_name=task_name,
        dataset_type=results["dataset"],
        dataset_name=results["dataset_name"],
        dataset_config=results.get("dataset_config"),
        dataset_split=results.get("split"),
    )
    return [
        EvalResult(
            **common,
            metric_type=kind,
            metric_name=name,
            metric_value=results[key],
            metric_config=results[f"{key}_signature"],
        )
        for kind, name, key in (
            ("bleu", "sacreBLEU", "bleu"),
            ("bleu", "BLEU (lowercased)", "bleu_lowercase"),
            ("chrf", "chrF", "chrf"),
        )
    ]


def _model_index(results: dict[str, Any], datasets: Sequence[str], language_pair: str | None) -> list[EvalResult]:
    """The model-index entries of the results (`_eval_results`), after completing `results` in place for them and
    for the card: the test set's Hub id ("dataset": a known corpus's name becomes its id), name and label, and the
    scores rounded to two decimals."""
    dataset = results.get("dataset") or (datasets[0] if datasets else None)
    if dataset is None:
        raise ValueError(
            "The results need a dataset for the model-index: pass datasets=[...] or set results['dataset']."
        )
    known = KNOWN_DATA.get(dataset)
    results["dataset"] = known.hub_id if known is not None and known.hub_id else dataset
    results["dataset_name"] = results.get("dataset_name") or (known.name if known is not None else dataset)
    dataset_config, split = results.get("dataset_config"), results.get("split")
    results["dataset_label"] = (
        results["dataset_name"]
        + (f" ({dataset_config})" if dataset_config else "")
        + (f", {split} split" if split else "")
    )
    for key in ("bleu", "bleu_lowercase", "chrf"):
        results[key] = round(float(results[key]), 2)
    return _eval_results(results, f"Translation {language_pair}" if language_pair else "Translation")


def _decoding(output_dir: Path) -> tuple[list[tuple[str, str]] | None, bool]:
    """The decoding table of the folder's generation_config.json and whether it is §6.1's; (None, False) without
    one."""
    path = output_dir / "generation_config.json"
    if not path.is_file():
        return None, False
    return decoding_rows(json.loads(path.read_text(encoding="utf-8")))


def _attention_images(output_dir: Path) -> list[tuple[str, str]]:
    """(title, path in the folder) of the attention maps: the three grids of plot_attention first, in its order,
    then any other image."""
    order = [f"{stem}.png" for stem, _ in ATTENTION_MAPS]
    titles = {f"{stem}.png": title for stem, title in ATTENTION_MAPS}
    images = sorted(
        (output_dir / ATTENTION_DIR).glob("*.png"),
        key=lambda path: (order.index(path.name) if path.name in order else len(order), path.name),
    )
    return [(titles.get(path.name, path.stem), f"{ATTENTION_DIR}/{path.name}") for path in images]


def render_model_card(
    output_dir: str | Path,
    config: CardConfig | None = None,
    results: Mapping[str, Any] | str | Path | None = None,
    languages: Sequence[str] = (),
    datasets: Sequence[str] = (),
    command: str | None = None,
    extra: str | None = None,
    *,
    model_name: str | None = None,
    repo_id: str | None = None,
    license: str | None = None,
    license_name: str | None = None,
    base_model: str | None = None,
    example_text: str | None = None,
    training: Mapping[str, Any] | None = None,
    data_note: str | None = None,
    out_of_domain: Mapping[str, str] | None = None,
) -> ModelCard:
    """The card of the model saved in `output_dir`; see `write_model_card` for the arguments."""
    output_dir = Path(output_dir)
    config = _config(output_dir, config)
    results = _results(results)
    model_name = model_name or output_dir.resolve().name
    languages = list(languages)
    language_fields = _card_languages(languages, "languages")
    if base_model is not None:
        check_repo_id(base_model)
    data = [KNOWN_DATA[name] for name in datasets if name in KNOWN_DATA]
    hub_datasets = _hub_datasets(datasets)
    language_pair = f"{languages[0]} → {languages[1]}" if len(languages) == 2 else None
    if example_text is None:
        example_text = DOMAIN_EXAMPLES.get(languages[0] if languages else "en", DOMAIN_EXAMPLES["en"])
    if out_of_domain is None and results is not None:
        out_of_domain = results.get("out_of_domain")

    eval_results = _model_index(results, datasets, language_pair) if results is not None else None
    license_fields = _license(license, license_name, data)
    card_data = ModelCardData(
        **language_fields,
        **license_fields,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", *TAGS],
        datasets=hub_datasets or None,
        base_model=base_model,
        metrics=["bleu", "chrf"] if results is not None else None,
        model_name=model_name,
        eval_results=eval_results,
        # The Hub's inference widget: a sentence of the model's own domain.
        widget=[{"text": example_text}],
    )
    decoding, paper_decoding = _decoding(output_dir)
    return _render(
        TEMPLATE,
        card_data,
        model_name=model_name,
        language_pair=language_pair,
        architecture=architecture_rows(config),
        repo_id=repo_id or model_name,
        repo_id_given=repo_id is not None,
        example_text=example_text,
        decoding=decoding,
        paper_decoding=paper_decoding,
        results=results,
        attention_images=_attention_images(output_dir),
        command=public_command(command) if command is not None else None,
        # A pushed card shows file names, never the folders of the machine that trained (`public_command`).
        training=[(name, public_path(_value(value))) for name, value in (training or {}).items() if value is not None],
        extra=extra,
        data=data[0] if data else None,
        data_note=data_note,
        license=license_fields,
        license_given=license is not None or license_name is not None,
        base_model=base_model,
        out_of_domain=out_of_domain,
        citations=[PAPER_CITATION, *_citations(data, languages), PROJECT_CITATION],
    )


def _value(value: Any) -> str:
    """A hyperparameter as the card shows it: numbers without float noise."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _render(template: Path, card_data: ModelCardData, **values: Any) -> ModelCard:
    """`template` rendered with the YAML metadata of `card_data` and `values`."""
    # Own environment for the `cell` filter (a "|" would split a Markdown table cell) and block whitespace rules.
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    environment.filters["cell"] = lambda value: str(value).replace("|", "\\|")
    content = environment.from_string(template.read_text(encoding="utf-8")).render(
        card_data=card_data.to_yaml(), **values
    )
    return ModelCard(content)


def source_card_metadata(folder: str | Path) -> dict[str, Any]:
    """The license, language and datasets fields of the model card (README.md) in a source model folder (an
    OPUS-MT folder, a folder trained here), for the card of its conversion; {} when it has none."""
    path = Path(folder) / "README.md"
    if not path.is_file():
        return {}
    data = ModelCard.load(path, ignore_metadata_errors=True).data.to_dict()
    keys = ("license", "license_name", "license_link", "language", "datasets")
    return {key: data[key] for key in keys if data.get(key)}


def render_converted_card(
    title: str,
    description: str,
    facts: Mapping[str, str],
    usage: str,
    notes: Sequence[str] = (),
    *,
    config: CardConfig | None = None,
    generation: Mapping[str, Any] | None = None,
    decoding_note: str = "",
    library_name: str = "transformers",
    tags: Sequence[str] = (),
    source: str | None = None,
    license: str | None = None,
    license_name: str | None = None,
    base_model: str | None = None,
    source_metadata: Mapping[str, Any] | None = None,
    languages: Sequence[str] = (),
) -> ModelCard:
    """The card of a checkpoint converted from another implementation: what it is (`title`, `description`), where
    it comes from and how it was verified (`facts`, a two-column table), the architecture table of `config` (ours,
    as config.json's dict; None for a model of another class) and the decoding table of `generation`
    (generation_config.json's values) with `decoding_note` below it (what a runtime keeps of them), the `usage` code
    and the `notes`. `library_name` and `tags` (besides translation and CONVERTED_TAGS) describe the folder's files
    on the Hub (an ONNX export: "onnx").

    Metadata: `license` (given by the user, a Hub license id; `other` with `license_name`) or the one the source's
    own card states (`source_metadata`, see `source_card_metadata`), else none; `base_model` the source's Hub id
    when the user gives it; `language` from `languages` or the source's card; the citations of the paper, of the
    `source` toolkit when known (TOOLKIT_CITATIONS) and of this project. Values given are checked (`check_license`,
    `check_repo_id`, `check_language`); a source card's license or languages that the Hub would not take are left
    out."""
    source_metadata = dict(source_metadata or {})
    if base_model is not None:
        check_repo_id(base_model)
    if license is not None or license_name is not None:
        license_fields = check_license(license, license_name)
    else:
        license_fields = _source_license(source_metadata)
    if languages:
        language_fields = _card_languages(languages, "languages")
    else:
        given = source_metadata.get("language") or []
        given = [given] if isinstance(given, str) else given
        language_fields = _card_languages([tag for tag in given if hub_language(tag)], "languages")
    card_data = ModelCardData(
        **language_fields,
        **license_fields,
        library_name=library_name,
        pipeline_tag="translation",
        tags=["translation", *CONVERTED_TAGS, *tags],
        datasets=source_metadata.get("datasets"),
        base_model=base_model,
        model_name=title,
    )
    citations = [PAPER_CITATION, *([TOOLKIT_CITATIONS[source]] if source in TOOLKIT_CITATIONS else [])]
    return _render(
        CONVERTED_TEMPLATE,
        card_data,
        title=title,
        description=description,
        facts=list(facts.items()),
        architecture=architecture_rows(config) if config is not None else None,
        decoding=decoding_rows(generation)[0] if generation is not None else None,
        decoding_note=decoding_note,
        usage=usage.strip(),
        notes=list(notes),
        license=license_fields,
        license_given=license is not None or license_name is not None,
        base_model=base_model,
        citations=[*citations, PROJECT_CITATION],
    )


def write_model_card(
    output_dir: str | Path,
    config: CardConfig | None = None,
    results: Mapping[str, Any] | str | Path | None = None,
    languages: Sequence[str] = (),
    datasets: Sequence[str] = (),
    command: str | None = None,
    extra: str | None = None,
    **options: Any,
) -> Path:
    """Write `output_dir/README.md`, the Hub model card, and return its path.

    Args:
        output_dir: the saved model folder (config.json, generation_config.json, attention/*.png are read there).
        config: the model config; None reads `output_dir/config.json`.
        results: `evaluate_translations` output (dict or path to its JSON), optionally with "dataset" (a Hub id or
            a known corpus's name, "multi30k"), "dataset_name", "dataset_config" and "split" keys describing the
            test set, and "out_of_domain"; None for no results. Its scores, with their sacreBLEU signatures as
            `metric_config`, become the model-index.
        languages: BCP-47 language tags as the Hub takes them (`check_language`), source first (["en", "de"]; the
            card's `language` gets each tag's ISO 639 part, "pt" of "pt-BR", and `language_bcp47` the tags).
        datasets: the training data as Hub dataset ids, or a known corpus's name ("multi30k", written as its Hub
            id `bentrevett/multi30k`); the first also names the test set unless `results["dataset"]`. Data that is
            not on the Hub is described with `data_note` instead.
        command: the training command, shown with file names for local paths (`public_command`).
        extra: Markdown appended after the evaluation.
        options: `model_name` (default: the folder name); `repo_id` (the Hub id the usage examples load; default:
            model_name, with a note to replace it); `license` (a Hub license id, `HUB_LICENSES`; default: the known
            training data's terms as `license: other` with their name and link, else none); `license_name` (with
            `license="other"`: the terms' kebab-case name); `base_model` (the Hub id a fine-tuned model started
            from); `example_text` (a source sentence of the model's domain for the widget
            and the examples; default: an image description in the source language); `training` (setting ->
            value rows of the training procedure); `data_note` (Markdown describing data not on the Hub);
            `out_of_domain` ({"source", "translation"}, see `evaluation.out_of_domain_translation`).
    """
    card = render_model_card(output_dir, config, results, languages, datasets, command, extra, **options)
    return save_card(card, Path(output_dir) / "README.md")


def save_card(card: ModelCard, path: Path) -> Path:
    """Write `card` to `path` whole and return `path`: into `.NAME.partial-PID` beside it, renamed over `path` once
    complete, so that a full disk (or a kill) leaves the old card or none, never a cut one that looks whole. The
    partial file is removed on an error, which propagates; the output folders' rule counts it as a writer's
    temporary file (hf_vanilla_transformer/files.py)."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        card.save(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def card_from_results(
    model_dir: str | Path, summary: Mapping[str, Any] | None = None, repo_id: str | None = None
) -> ModelCard | None:
    """The card of a model folder written by `train`, rendered from what the folder holds: config.json,
    generation_config.json, attention/*.png and results.json (or `summary`, its contents), whose "card" entry keeps
    the card's other inputs (`write_model_card`'s keyword arguments, "test_set" describing "test"). With `repo_id`
    the usage examples load that Hub repository. None where results.json holds no card inputs (a converted
    folder, a run without evaluation or from an older version): its README.md is the card as it is."""
    model_dir = Path(model_dir)
    if summary is None:
        path = model_dir / "results.json"
        if not path.is_file():
            return None
        summary = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(summary, Mapping) or not summary.get("card") or "test" not in summary:
        return None
    inputs = dict(summary["card"])
    results = dict(summary["test"], **inputs.pop("test_set"))
    return render_model_card(
        model_dir, results=results, repo_id=repo_id, out_of_domain=summary.get("out_of_domain"), **inputs
    )


def card_for_repository(model_dir: str | Path, repo_id: str) -> ModelCard | None:
    """The folder's card with its examples loading `repo_id`: rendered again from results.json where `train` wrote
    the folder (`card_from_results`); otherwise (a converted folder) its README.md with every `from_pretrained(...)`
    and `pipeline(..., model=...)` of its examples pointed at the repository instead of the local folder the converter
    wrote. None where the folder has no README.md."""
    card = card_from_results(model_dir, repo_id=repo_id)
    if card is not None:
        return card
    path = Path(model_dir) / "README.md"
    if not path.is_file():
        return None
    text = re.sub(r'from_pretrained\("[^"]*"', f'from_pretrained("{repo_id}"', path.read_text(encoding="utf-8"))
    return ModelCard(re.sub(r'model="[^"]*"', f'model="{repo_id}"', text))


__all__ = [
    "ATTENTION_MAPS",
    "MULTI30K",
    "CardConfig",
    "TrainingData",
    "architecture",
    "architecture_rows",
    "card_for_repository",
    "card_from_results",
    "count_parameters",
    "decoding_rows",
    "render_converted_card",
    "render_model_card",
    "save_card",
    "source_card_metadata",
    "write_model_card",
]
