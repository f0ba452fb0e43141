"""Attention maps of one sentence pair: encoder self-attention, decoder (masked) self-attention and encoder-decoder
attention (§3.2.3), one heatmap per layer and head, tokens on the axes (as the paper's appendix figures).

The weights are softmax(Q Kᵀ / √d_k) of eq. (1), read with the eager attention implementation (`sdpa` does not
return them). `plot_attention` writes three PNG grids (layers × heads); `plot_attention_maps(AttentionOptions(...))`
does so for a saved model folder, as `hf-vanilla-transformer attention MODEL_DIR "sentence" --out DIR`.
Shapes: N layers, H heads, S source length, T target length (decoder positions).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel, PreTrainedTokenizerBase

from ..files import ATTENTION_LAYOUT, check_output_folder, refuse_inputs, write_manifest
from ..option_fields import option, positive_int
from .loading import load_tokenizer, model_folder, trust_remote_code_option

# The attention maps' folder inside a model folder written by `train` (the model card shows them).
ATTENTION_DIR = "attention"

PLOTS = (
    # (file stem, title, AttentionMaps field, row labels, column labels)
    ("encoder_self_attention", "Encoder self-attention", "encoder", "source_tokens", "source_tokens"),
    ("decoder_self_attention", "Decoder self-attention (masked)", "decoder", "output_tokens", "decoder_input_tokens"),
    ("cross_attention", "Encoder-decoder attention", "cross", "output_tokens", "source_tokens"),
)


@dataclass
class AttentionMaps:
    """Attention weights of one sentence pair; every row of every map sums to 1.

    Decoder position t reads `decoder_input_tokens[t]` (the start token, then the target shifted right, §3.1) and
    predicts `output_tokens[t]`, which labels its row in the decoder and cross maps.
    """

    source_tokens: list[str]
    decoder_input_tokens: list[str]
    output_tokens: list[str]
    encoder: torch.Tensor  # (N, H, S, S)
    decoder: torch.Tensor  # (N, H, T, T)
    cross: torch.Tensor  # (N, H, T, S)


@contextmanager
def eager_attention(model: PreTrainedModel) -> Iterator[None]:
    """Switch `model` to the eager attention implementation for the block (only it returns the weights)."""
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)


def token_labels(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Readable axis labels: each id decoded alone; the raw token where that gives nothing readable (a byte piece)."""
    labels = []
    for token_id in ids:
        text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False).strip()
        labels.append(text if text and "\ufffd" not in text else tokenizer.convert_ids_to_tokens(token_id))
    return labels


def attention_maps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    target: str | None = None,
    generation_kwargs: dict[str, Any] | None = None,
) -> AttentionMaps:
    """Attention weights of `model` on `source` and `target` (teacher-forced). Without a target, the model's own
    translation (`model.generate` with `generation_kwargs`) is used."""
    model.eval()
    encoded = tokenizer(source, return_tensors="pt", truncation=True).to(model.device)
    start = model.generation_config.decoder_start_token_id
    start = model.config.decoder_start_token_id if start is None else start
    with eager_attention(model), torch.inference_mode():
        if target is None:
            sequence = model.generate(**encoded, **(generation_kwargs or {}))[0].tolist()
        else:
            sequence = [start, *tokenizer(text_target=target)["input_ids"]]
        eos = model.config.eos_token_id
        if eos in sequence[1:]:
            sequence = sequence[: sequence.index(eos, 1) + 1]  # drop beam padding after </s>
        decoder_input_ids = torch.tensor([sequence[:-1]], device=model.device)  # (1, T)
        outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True, return_dict=True)
    return AttentionMaps(
        source_tokens=token_labels(tokenizer, encoded["input_ids"][0].tolist()),
        decoder_input_tokens=token_labels(tokenizer, sequence[:-1]),
        output_tokens=token_labels(tokenizer, sequence[1:]),
        # Per layer (1, H, Q, K) -> (N, H, Q, K)
        encoder=torch.cat(outputs.encoder_attentions).float().cpu(),
        decoder=torch.cat(outputs.decoder_attentions).float().cpu(),
        cross=torch.cat(outputs.cross_attentions).float().cpu(),
    )


def _check_indices(name: str, indices: list[int] | None, count: int, stack: str) -> list[int]:
    if indices is None:
        return list(range(count))
    for index in indices:
        if not 0 <= index < count:
            raise ValueError(
                f"`{name}` holds {index}, but the {stack} has {count} {name} (0 to {count - 1}). Pick from that range."
            )
    return list(indices)


def plot_attention(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    target: str | None = None,
    out_dir: str | Path = "attention",
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    generation_kwargs: dict[str, Any] | None = None,
    dpi: int = 120,
) -> list[Path]:
    """Plot encoder self-, decoder self- and cross-attention of one sentence as layers × heads grids of heatmaps.

    `layers` / `heads` (0-based) select rows / columns of the grids; all by default. Without `target` the model
    translates `source` first. Writes encoder_self_attention.png, decoder_self_attention.png and
    cross_attention.png into `out_dir` (a new or empty folder, or one of plots it wrote: files.check_output_folder,
    before anything is computed) with a manifest naming them, and returns their paths. The model card embeds a model
    folder's `attention/*.png`.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # an optional dependency: plotting only
        raise ImportError("Plotting needs matplotlib: pip install 'hf_vanilla_transformer[eval]'.") from error
    out_dir = Path(out_dir)
    check_output_folder(out_dir, "out", ATTENTION_LAYOUT, replaced=False)
    maps = attention_maps(model, tokenizer, source, target, generation_kwargs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, title, field, rows, columns in PLOTS:
        weights: torch.Tensor = getattr(maps, field)
        stack = "encoder" if field == "encoder" else "decoder"
        chosen_layers = _check_indices("layers", layers, weights.shape[0], stack)
        chosen_heads = _check_indices("heads", heads, weights.shape[1], stack)
        row_labels, column_labels = getattr(maps, rows), getattr(maps, columns)
        # Cells grow with the sentence so that token labels stay legible, within bounds.
        cell = min(max(2.2, 0.25 * max(len(row_labels), len(column_labels))), 6.0)
        figure = Figure(
            figsize=(cell * len(chosen_heads) + 1.0, cell * len(chosen_layers) + 0.8), layout="constrained"
        )
        axes = figure.subplots(len(chosen_layers), len(chosen_heads), squeeze=False)
        for i, layer in enumerate(chosen_layers):
            for j, head in enumerate(chosen_heads):
                axis = axes[i][j]
                image = axis.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
                axis.set_title(f"layer {layer}, head {head}", fontsize=8)
                # Tokens on the outer axes only; inner panels share them.
                axis.set_yticks(range(len(row_labels)), row_labels if j == 0 else [], fontsize=7)
                last_row = i == len(chosen_layers) - 1
                axis.set_xticks(range(len(column_labels)), column_labels if last_row else [], fontsize=7, rotation=90)
        figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
        figure.suptitle(f"{title}: {source}")
        path = out_dir / f"{stem}.png"
        figure.savefig(path, dpi=dpi)
        paths.append(path)
    write_manifest(out_dir, ATTENTION_LAYOUT.kind, [path.name for path in paths])
    return paths


@dataclass(frozen=True)
class AttentionOptions:
    """Plot the attention maps of `sentence` (teacher-forced on `target`, else the model's own translation) into
    `out`; `layers` / `heads` (0-based) select the rows / columns of the grids (all by default)."""

    model_dir: str | os.PathLike
    sentence: str
    target: str | None = option(None, help="a reference translation to teacher-force (default: the model's own)")
    out: str | os.PathLike = option(ATTENTION_DIR, help="output folder: new, empty, or earlier plots")
    layers: list[int] | None = option(None, help="0-based layers to plot (default: all)", parse=int, nargs="+")
    heads: list[int] | None = option(None, help="0-based heads to plot (default: all)", parse=int, nargs="+")
    dpi: int = option(120, help="the images' resolution, dots per inch", parse=positive_int)
    trust_remote_code: bool = trust_remote_code_option()


def plot_attention_maps(options: AttentionOptions) -> list[Path]:
    """Encoder self-, decoder self- and encoder-decoder attention grids of a saved model folder as PNGs; returns
    their paths. `out` is checked before the model is loaded: it is apart from the model folder (but for the model
    folder's own attention/, which the card shows), and a new or empty folder or one of plots (`plot_attention`)."""
    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    out = Path(options.out)
    if out.resolve() != model_dir.resolve() / ATTENTION_DIR:
        refuse_inputs(out, "out", [("model_dir", model_dir)], f"Pass a folder outside it, e.g. {ATTENTION_DIR}.")
    check_output_folder(out, "out", ATTENTION_LAYOUT, replaced=False)
    model = AutoModelForSeq2SeqLM.from_pretrained(
        model_dir, attn_implementation="eager", trust_remote_code=options.trust_remote_code
    )
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    return plot_attention(
        model,
        tokenizer,
        options.sentence,
        options.target,
        options.out,
        layers=options.layers,
        heads=options.heads,
        dpi=options.dpi,
    )


__all__ = [
    "ATTENTION_DIR",
    "PLOTS",
    "AttentionMaps",
    "AttentionOptions",
    "attention_maps",
    "eager_attention",
    "plot_attention",
    "plot_attention_maps",
    "token_labels",
]
