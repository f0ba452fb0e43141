"""Write a Hub model card (README.md) for a saved model folder from its real files, and upload the folder; the card
of a converted checkpoint (`render_converted_card`, used by `python -m conversion`) comes from here too.

Every number in the card comes from an input: the architecture table and parameter count from config.json (or the
config passed), the decoding table from generation_config.json, the scores from the results dict / JSON written by
`hf_vanilla_transformer.evaluation.write_results_json`; attention maps are the folder's `attention/*.png` (as written
by `hf-vanilla-transformer attention MODEL_DIR "..." --out MODEL_DIR/attention`). Nothing is typed by hand.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import torch
from huggingface_hub import CommitInfo, CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData
from transformers.dynamic_module_utils import get_relative_import_files

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.attention_maps import PLOTS
from hf_vanilla_transformer.files import TARGET_TOKENIZER, TOKENIZER_FILES

TEMPLATE = Path(__file__).with_name("template.md")
CONVERTED_TEMPLATE = Path(__file__).with_name("converted_template.md")
TAGS = ["vanilla-transformer", "attention-is-all-you-need"]
CONVERTED_TAGS = ["vanilla-transformer", "converted"]
# A sentence of the paper's abstract, for the usage examples.
EXAMPLE_TEXT = "The Transformer is based solely on attention mechanisms."

# What a Hub repository of this model holds besides its code files (`code_files`); patterns match paths relative to
# the folder, one level per "/". No pickle (pytorch_model.bin) and no top-level *.py: only the code config.json
# names is uploaded.
HUB_FILES = (
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
    *(f"{TARGET_TOKENIZER}/{name}" for name in TOKENIZER_FILES),
    "attention/*.png",
    "learning_curve.png",
)


def _config(output_dir: Path, config: VanillaTransformerConfig | Mapping[str, Any] | None) -> VanillaTransformerConfig:
    if config is None:
        path = output_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"No config given and no {path}. Save the model there first, or pass `config`.")
        config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config, Mapping):
        config = VanillaTransformerConfig.from_dict(dict(config))
    return config


def count_parameters(config: VanillaTransformerConfig) -> int:
    """Parameters of the model `config` describes, tied matrices once; built on the meta device (no memory)."""
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    return sum(parameter.numel() for parameter in model.parameters())


def architecture_rows(config: VanillaTransformerConfig) -> list[tuple[str, str, str]]:
    """(setting, this model, paper base model) rows, §3 and Table 3."""

    def pair(encoder: object, decoder: object) -> str:
        return f"{encoder}" if encoder == decoder else f"{encoder} / {decoder}"

    share, tie = config.share_encoder_decoder_embeddings, config.tie_word_embeddings
    tying = {
        (True, True): "three-way (both embeddings and output layer)",
        (True, False): "source and target embeddings only",
        (False, True): "target embedding and output layer",
        (False, False): "none",
    }[share, tie]
    if config.position_embedding_type == "sinusoidal":
        positions = f"sinusoidal, {config.sinusoidal_layout}"
    else:
        positions = "learned"
    if config.position_offset:
        positions += f", offset {config.position_offset}"
    norm = "pre-LN" if config.normalize_before else "post-LN"
    if config.add_final_layer_norm:
        norm += ", final LayerNorm per stack"
    vocab = f"{config.vocab_size} shared" if share else f"{config.vocab_size} / {config.decoder_vocab_size}"
    parameters = count_parameters(config)
    return [
        ("Layers N (encoder / decoder)", pair(config.encoder_layers, config.decoder_layers), "6"),
        ("d_model", str(config.d_model), "512"),
        ("Heads h", pair(config.encoder_attention_heads, config.decoder_attention_heads), "8"),
        (
            "d_k = d_v",
            pair(config.d_model // config.encoder_attention_heads, config.d_model // config.decoder_attention_heads),
            "64",
        ),
        ("d_ff", pair(config.encoder_ffn_dim, config.decoder_ffn_dim), "2048"),
        ("Activation", config.activation_function, "relu"),
        ("Dropout P_drop", f"{config.dropout:g}", "0.1"),
        (
            "Attention / activation dropout",
            f"{config.attention_dropout:g} / {config.activation_dropout:g}",
            "none",
        ),
        ("Vocabulary", vocab, "~37000 shared BPE (EN-DE)"),
        ("Weight tying (§3.4)", tying, "three-way"),
        ("Embeddings × √d_model (§3.4)", "yes" if config.scale_embedding else "no", "yes"),
        ("Positional encoding (§3.5)", positions, "sinusoidal, interleaved"),
        ("Layer normalization (§3.1)", norm, "post-LN"),
        ("LayerNorm ε", f"{config.layer_norm_eps:g}", "not given"),
        ("Output-layer bias", "yes" if config.lm_head_bias else "no", "no"),
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
    else:
        limit = f"{generation.get('max_length', 20)} tokens"
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


def render_model_card(
    output_dir: str | Path,
    config: VanillaTransformerConfig | Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | str | Path | None = None,
    languages: Sequence[str] = (),
    datasets: Sequence[str] = (),
    command: str | None = None,
    extra: str | None = None,
    *,
    model_name: str | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    example_text: str = EXAMPLE_TEXT,
) -> ModelCard:
    """The card of the model saved in `output_dir`; see `write_model_card` for the arguments."""
    output_dir = Path(output_dir)
    config = _config(output_dir, config)
    results = _results(results)
    model_name = model_name or output_dir.resolve().name
    languages, datasets = list(languages), list(datasets)
    language_pair = f"{languages[0]} → {languages[1]}" if len(languages) == 2 else None

    eval_results = None
    if results is not None:
        dataset = results.get("dataset") or (datasets[0] if datasets else None)
        if dataset is None:
            raise ValueError(
                "The results need a dataset for the model-index: pass datasets=[...] or set results['dataset']."
            )
        dataset_name = results.get("dataset_name") or dataset
        dataset_config, split = results.get("dataset_config"), results.get("split")
        results["dataset_label"] = (
            dataset_name + (f" ({dataset_config})" if dataset_config else "") + (f", {split} split" if split else "")
        )
        for key in ("bleu", "bleu_lowercase", "chrf"):
            results[key] = round(float(results[key]), 2)
        common = dict(
            task_type="translation",
            task_name=f"Translation {language_pair}" if language_pair else "Translation",
            dataset_type=dataset,
            dataset_name=dataset_name,
            dataset_config=dataset_config,
            dataset_split=split,
        )
        eval_results = [
            EvalResult(**common, metric_type="bleu", metric_name="sacreBLEU", metric_value=results["bleu"]),
            EvalResult(
                **common, metric_type="bleu", metric_name="BLEU (lowercased)", metric_value=results["bleu_lowercase"]
            ),
            EvalResult(**common, metric_type="chrf", metric_name="chrF", metric_value=results["chrf"]),
        ]

    card_data = ModelCardData(
        language=languages or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=list(TAGS),
        datasets=datasets or None,
        metrics=["bleu", "chrf"] if results is not None else None,
        model_name=model_name,
        eval_results=eval_results,
    )
    generation_path = output_dir / "generation_config.json"
    decoding, paper_decoding = None, False
    if generation_path.is_file():
        decoding, paper_decoding = decoding_rows(json.loads(generation_path.read_text(encoding="utf-8")))
    # The three grids of plot_attention first, in its order, then any other image.
    order = [f"{stem}.png" for stem, *_ in PLOTS]
    titles = {f"{stem}.png": title for stem, title, *_ in PLOTS}
    images = sorted(
        (output_dir / "attention").glob("*.png"),
        key=lambda path: (order.index(path.name) if path.name in order else len(order), path.name),
    )
    attention_images = [(titles.get(path.name, path.stem), f"attention/{path.name}") for path in images]
    return _render(
        TEMPLATE,
        card_data,
        model_name=model_name,
        language_pair=language_pair,
        architecture=architecture_rows(config),
        repo_id=repo_id or model_name,
        example_text=example_text,
        decoding=decoding,
        paper_decoding=paper_decoding,
        results=results,
        attention_images=attention_images,
        command=command,
        extra=extra,
    )


def _render(template: Path, card_data: ModelCardData, **values: Any) -> ModelCard:
    """`template` rendered with the YAML metadata of `card_data` and `values`."""
    # Own environment for the `cell` filter (a "|" would split a Markdown table cell) and block whitespace rules.
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    environment.filters["cell"] = lambda value: str(value).replace("|", "\\|")
    content = environment.from_string(template.read_text(encoding="utf-8")).render(
        card_data=card_data.to_yaml(), **values
    )
    return ModelCard(content)


def render_converted_card(
    title: str,
    description: str,
    facts: Mapping[str, str],
    usage: str,
    notes: Sequence[str] = (),
    *,
    config: VanillaTransformerConfig | None = None,
    generation: Mapping[str, Any] | None = None,
) -> ModelCard:
    """The card of a checkpoint converted from another implementation: what it is (`title`, `description`), where
    it comes from and how it was verified (`facts`, a two-column table), the architecture table of `config` (ours;
    None for a model of another class) and the decoding table of `generation` (generation_config.json's values),
    the `usage` code and the `notes`."""
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag="translation", tags=list(CONVERTED_TAGS), model_name=title
    )
    return _render(
        CONVERTED_TEMPLATE,
        card_data,
        title=title,
        description=description,
        facts=list(facts.items()),
        architecture=architecture_rows(config) if config is not None else None,
        decoding=decoding_rows(generation)[0] if generation is not None else None,
        usage=usage.strip(),
        notes=list(notes),
    )


def write_model_card(
    output_dir: str | Path,
    config: VanillaTransformerConfig | Mapping[str, Any] | None = None,
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
        results: `evaluate_translations` output (dict or path to its JSON), optionally with "dataset" (Hub id),
            "dataset_name", "dataset_config" and "split" keys describing the test set; None for no results.
        languages: ISO codes, source first (["en", "de"]).
        datasets: Hub ids of the training data; the first also names the test set unless `results["dataset"]`.
        command: the training command, shown verbatim.
        extra: Markdown appended before the citation.
        options: `model_name` (default: the folder name), `repo_id` (for the usage examples; default: model_name),
            `license` (default "apache-2.0"), `example_text`.
    """
    card = render_model_card(output_dir, config, results, languages, datasets, command, extra, **options)
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def code_files(output_dir: str | Path) -> list[str]:
    """The model's code files in the folder, as transformers copies them for remote code: the modules that
    config.json's `auto_map` and `custom_pipelines` name, and the modules they import relatively, transitively
    (transformers' own `get_relative_import_files`). Computed, so a helper module the model code imports is
    included and a stray `secrets_config.py` beside them is not. Raises ValueError when config.json has no
    auto_map or a named or imported module is missing."""
    output_dir = Path(output_dir)
    config = json.loads((output_dir / "config.json").read_text(encoding="utf-8"))
    if "auto_map" not in config:
        raise ValueError(
            f"{output_dir / 'config.json'} has no auto_map, so the Hub copy would not load with trust_remote_code. "
            "Save the model with hf_vanilla_transformer imported."
        )
    references = [task["impl"] for task in config.get("custom_pipelines", {}).values()]
    for value in config["auto_map"].values():
        # "module.Class", "repo--module.Class", or a [slow, fast] pair for tokenizers
        references += [item for item in (value if isinstance(value, list) else [value]) if item]
    modules = set()
    for reference in references:
        module = output_dir / (reference.split("--")[-1].rsplit(".", 1)[0] + ".py")
        if not module.is_file():
            raise ValueError(f"config.json refers to {reference} but {module} is missing. Save again.")
        try:
            modules |= {module, *(Path(path) for path in get_relative_import_files(module))}
        except FileNotFoundError as error:
            raise ValueError(f"{module} imports a module the folder lacks ({error.filename}). Save again.") from error
    return sorted(path.relative_to(output_dir).as_posix() for path in modules)


def hub_files(output_dir: str | Path, patterns: Sequence[str] = HUB_FILES) -> list[str]:
    """The folder's files to upload (relative POSIX paths, sorted): those matching `patterns`, each pattern at its
    own depth, so checkpoints/, runs/ and training_args.bin stay local, plus exactly the model's `code_files`.
    Checks the folder is a complete model."""
    output_dir = Path(output_dir)
    found = sorted(path.relative_to(output_dir).as_posix() for path in output_dir.rglob("*") if path.is_file())
    selected = [
        name
        for name in found
        if any(fnmatch.fnmatchcase(name, pattern) and name.count("/") == pattern.count("/") for pattern in patterns)
    ]
    for required, fix in (
        ("config.json", "save the model with save_pretrained"),
        ("README.md", "write the model card with model_card.write_model_card"),
    ):
        if required not in selected:
            raise ValueError(f"{output_dir} has no {required}; {fix} first.")
    if not any(name.endswith(".safetensors") for name in selected):
        raise ValueError(f"{output_dir} has no safetensors weights; save the model with save_pretrained first.")
    return sorted({*selected, *code_files(output_dir)})


def push_folder_to_hub(
    output_dir: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload Vanilla Transformer",
    revision: str | None = None,
    create_pr: bool = False,
    patterns: Sequence[str] = HUB_FILES,
) -> CommitInfo:
    """Create `repo_id` if needed and upload the folder's `hub_files` in one commit (weights, config with auto_map
    and custom_pipelines, generation config, tokenizer, code files, README.md card, attention maps).

    Unlike `model.push_to_hub`, which writes a generic README.md when the repository has none, the folder's own
    card is uploaded.
    """
    files = hub_files(output_dir, patterns)
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(Path(output_dir) / name)) for name in files
    ]
    return api.create_commit(
        repo_id=repo_id, operations=operations, commit_message=commit_message, revision=revision, create_pr=create_pr
    )


__all__ = [
    "HUB_FILES",
    "architecture_rows",
    "code_files",
    "count_parameters",
    "decoding_rows",
    "hub_files",
    "push_folder_to_hub",
    "render_converted_card",
    "render_model_card",
    "write_model_card",
]
