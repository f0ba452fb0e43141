"""hf_vanilla_transformer -> ONNX, run with onnxruntime (`python -m conversion to-onnx`, docs/conversion.md).

Route: `torch.onnx.export(..., dynamo=True)` of our own model, not `to-marian` followed by optimum's Marian export.
optimum-onnx (0.1.0, the only release) requires `transformers<4.58` and `optimum~=2.1`, so it cannot be installed
beside the transformers 5 this package needs; a route users cannot install does not serve them. Exporting our model
directly also keeps every setting `to-marian` cannot represent (learned positions, pre-LN, the Annotated
LayerNorm, separate vocabularies, ...) and needs no token-id remapping, and its only dependencies are `onnx`,
`onnxscript` (the exporter) and `onnxruntime` (extra `onnx`).

Two graphs, the usual encoder-decoder split with a key/value cache:

- `encoder.onnx`: input_ids (B, S), attention_mask (B, S) -> encoder_hidden_states (B, S, D) and every decoder
  layer's encoder-decoder attention keys and values, `cross_keys` / `cross_values` (N, B, H, S, Dh), projected
  once per sentence as our `generate` does at its first step.
- `decoder.onnx`: one decoding step. decoder_input_ids (B, 1), encoder_hidden_states, encoder_attention_mask (B, S),
  cross_keys, cross_values, past_keys / past_values (N, B, H, P, Dh; P = 0 at the first step) -> logits (B, V) of
  the new position and present_keys / present_values (N, B, H, P + 1, Dh). The position is P.

Both are traced from our model's own forward (the decoder with an `EncoderDecoderCache` built from the input
tensors), so the graphs compute what `generate` computes. The sinusoid tables are exported with `max_positions`
rows (our model extrapolates them on demand, which a graph cannot): longer inputs or outputs are refused by
`OnnxTranslator`. `OnnxTranslator.generate` is greedy decoding with the folder's generation config (EOS, start and
pad ids, the maximum length, §6.1's per-sentence `max_new_tokens_offset`, a forced EOS at the last position,
single-token `bad_words_ids`); a generation config with other greedy settings is refused at export.

`convert(OnnxOptions(SOURCE, OUTPUT_DIR, ...))` ends in the shared `finish` step of every conversion: the folder
(graphs, onnx_config.json, config.json, generation_config.json, tokenizer files) is written beside OUTPUT_DIR, the
ONNX logits of teacher-forced decoding, step by step through the cache, are checked against our model's on sample
inputs (three right-padded rows) within `atol_fp32` (both are float32 computations that differ by rounding alone),
the model card states the measured difference, how to run the folder with onnxruntime and what of the generation
config (§6.1's decoding) the greedy loop keeps, and only then does the folder replace OUTPUT_DIR.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from transformers import AutoTokenizer, GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.files import TARGET_TOKENIZER, TOKENIZER_FILES
from hf_vanilla_transformer.inference.loading import check_our_folder, read_json
from hf_vanilla_transformer.model.modeling_vanilla_transformer import VanillaTransformerSinusoidalPositionalEmbedding
from model_card import source_card_metadata

from ._common import (
    CardText,
    CommonOptions,
    Converted,
    Finished,
    SourceCheck,
    check_output,
    finish,
    sample_inputs,
    verify_logits,
)

if TYPE_CHECKING:  # an optional dependency (the `onnx` extra), imported where an export is run
    import onnxruntime

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
ONNX_CONFIG_FILE = "onnx_config.json"
ENCODER_INPUTS = ("input_ids", "attention_mask")
ENCODER_OUTPUTS = ("encoder_hidden_states", "cross_keys", "cross_values")
DECODER_INPUTS = (
    "decoder_input_ids",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "cross_keys",
    "cross_values",
    "past_keys",
    "past_values",
)
DECODER_OUTPUTS = ("logits", "present_keys", "present_values")
DEFAULT_MAX_POSITIONS = 1024
INSTALL_HINT = "pip install 'hf_vanilla_transformer[onnx]' (onnx, onnxscript, onnxruntime)"
# Generation settings `OnnxTranslator.generate` implements (the rest of a greedy search's settings are refused at
# export). Beam search and sampling settings are ignored: it is greedy decoding.
UNSUPPORTED_GREEDY_SETTINGS = {
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
}


# ------------------------------------------------------------------------------------------------ the graphs
class _TensorLengthCache(DynamicCache):
    """The decoder's self-attention cache during export: its length as a tensor, which our decoder then adds to the
    positions as a graph value. A Python int (DynamicCache's) would fix the traced graph to the example's length."""

    def get_seq_length(self, layer_idx: int | None = 0) -> Any:
        return torch.scalar_tensor(self.layers[layer_idx or 0].keys.shape[-2], dtype=torch.long)


class EncoderGraph(nn.Module):
    """`encoder.onnx`: our encoder, plus the decoder layers' K/V projections of its output (`ENCODER_OUTPUTS`)."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.model.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        keys, values = [], []
        for layer in self.model.model.decoder.layers:
            attention = layer.encoder_attn
            shape = (*states.shape[:-1], attention.num_heads, attention.head_dim)
            keys.append(attention.k_proj(states).view(shape).transpose(1, 2))  # (B, S, D) -> (B, H, S, Dh)
            values.append(attention.v_proj(states).view(shape).transpose(1, 2))
        return states, torch.stack(keys), torch.stack(values)


class DecoderStepGraph(nn.Module):
    """`decoder.onnx`: one step of our decoder through an `EncoderDecoderCache` made of the input tensors."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.decoder_layers

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layers = range(self.layers)
        cache = EncoderDecoderCache(
            _TensorLengthCache([(past_keys[i], past_values[i]) for i in layers]),
            DynamicCache([(cross_keys[i], cross_values[i]) for i in layers]),
        )
        cache.is_updated = dict.fromkeys(layers, True)  # the cross K/V are given: never projected again
        hidden = self.model.model.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,  # read for its shape only: the K/V come from the cache
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        logits = self.model.lm_head(hidden[:, -1])
        present = cache.self_attention_cache.layers
        return logits, torch.stack([present[i].keys for i in layers]), torch.stack([present[i].values for i in layers])


def _onnx_modules() -> None:
    """Fail with one line when the exporter's packages are missing."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError as error:
            raise NotImplementedError(f"ONNX export needs the `{name}` package: {INSTALL_HINT}.") from error


def position_limit(model: VanillaTransformerForConditionalGeneration, max_positions: int) -> int:
    """The number of positions the graphs hold: learned tables are fixed, sinusoid tables get `max_positions` rows."""
    if model.config.position_embedding_type == "learned":
        return model.config.max_position_embeddings
    return max_positions


def export_graphs(model: VanillaTransformerForConditionalGeneration, folder: Path, max_positions: int) -> None:
    """Write `encoder.onnx` and `decoder.onnx` of `model` (float32, eval mode) to `folder`, with dynamic batch,
    source and cache lengths up to `max_positions` (`position_limit`)."""
    _onnx_modules()
    config = model.config
    tables = [
        module for module in model.modules() if isinstance(module, VanillaTransformerSinusoidalPositionalEmbedding)
    ]
    saved = [module.table for module in tables]
    inputs = sample_inputs(config)
    with torch.no_grad():
        for module in tables:  # a graph cannot extend the table on demand as our model does
            module.table = module.create_table(max_positions)
        try:
            encoder = EncoderGraph(model)
            states, cross_keys, cross_values = encoder(inputs["input_ids"], inputs["attention_mask"])
            batch = torch.export.Dim("batch")
            source = torch.export.Dim("source", max=max_positions)
            past = torch.export.Dim("past", min=0, max=max_positions - 1)
            sequence = {0: batch, 1: source}
            layered = {1: batch, 3: source}
            with warnings.catch_warnings():  # the exporter's own deprecation chatter, not the user's concern
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    encoder,
                    (inputs["input_ids"], inputs["attention_mask"]),
                    str(folder / ENCODER_FILE),
                    dynamo=True,
                    input_names=list(ENCODER_INPUTS),
                    output_names=list(ENCODER_OUTPUTS),
                    dynamic_shapes={"input_ids": sequence, "attention_mask": sequence},
                    verbose=False,
                )
                # An example past of 3 positions: a length of 0 or 1 would be specialised into the graph.
                shape = (config.decoder_layers, states.shape[0], *cross_keys.shape[2:3], 3, cross_keys.shape[-1])
                example = (
                    inputs["decoder_input_ids"][:, :1],
                    states,
                    inputs["attention_mask"],
                    cross_keys,
                    cross_values,
                    torch.randn(shape),
                    torch.randn(shape),
                )
                torch.onnx.export(
                    DecoderStepGraph(model),
                    example,
                    str(folder / DECODER_FILE),
                    dynamo=True,
                    input_names=list(DECODER_INPUTS),
                    output_names=list(DECODER_OUTPUTS),
                    dynamic_shapes={
                        "decoder_input_ids": {0: batch},
                        "encoder_hidden_states": sequence,
                        "encoder_attention_mask": sequence,
                        "cross_keys": layered,
                        "cross_values": layered,
                        "past_keys": {1: batch, 3: past},
                        "past_values": {1: batch, 3: past},
                    },
                    verbose=False,
                )
        finally:
            for module, table in zip(tables, saved, strict=True):
                module.table = table


# ------------------------------------------------------------------------------------------------ running it
class OnnxTranslator:
    """An exported folder run with onnxruntime: `generate` (greedy token ids, as our `generate(num_beams=1,
    do_sample=False)`), `step_logits` (teacher-forced logits through the cache) and `translate` (text)."""

    def __init__(
        self,
        folder: str | Path,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        session_options: onnxruntime.SessionOptions | None = None,
    ) -> None:
        try:
            import onnxruntime  # optional (the `onnx` extra): only running an export needs it
        except ImportError as error:
            raise NotImplementedError(f"Running an ONNX export needs onnxruntime: {INSTALL_HINT}.") from error
        self.folder = Path(folder)
        config_path = self.folder / ONNX_CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{self.folder} has no {ONNX_CONFIG_FILE}; write it with python -m conversion to-onnx."
            )
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        self.generation_config = GenerationConfig.from_pretrained(self.folder)

        def session(name: str) -> onnxruntime.InferenceSession:
            return onnxruntime.InferenceSession(str(self.folder / name), session_options, providers=list(providers))

        self.encoder, self.decoder = session(ENCODER_FILE), session(DECODER_FILE)
        self._tokenizers: tuple[Any, Any] | None = None

    def encode(self, input_ids: Any, attention_mask: Any | None = None) -> dict[str, np.ndarray]:
        """Run `encoder.onnx`: the decoder's encoder-side inputs for the batch, by name."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        if input_ids.ndim != 2 or mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids must be (batch, length) and attention_mask the same shape; got {input_ids.shape} and "
                f"{mask.shape}."
            )
        if input_ids.shape[1] > self.config["max_positions"]:
            raise ValueError(
                f"input_ids has {input_ids.shape[1]} positions, more than the {self.config['max_positions']} this "
                "export holds. Truncate the input, or export again with a larger max_positions "
                "(python -m conversion to-onnx --max-positions)."
            )
        outputs = self.encoder.run(list(ENCODER_OUTPUTS), {"input_ids": input_ids, "attention_mask": mask})
        return {"encoder_attention_mask": mask, **dict(zip(ENCODER_OUTPUTS, outputs, strict=True))}

    def _empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        shape = (self.config["decoder_layers"], batch, self.config["num_heads"], 0, self.config["head_dim"])
        return {"past_keys": np.zeros(shape, np.float32), "past_values": np.zeros(shape, np.float32)}

    def _step(self, tokens: np.ndarray, encoded: dict[str, np.ndarray], cache: dict[str, np.ndarray]) -> np.ndarray:
        """One decoder step for tokens (B,); updates `cache` in place and returns the logits (B, V)."""
        logits, cache["past_keys"], cache["past_values"] = self.decoder.run(
            list(DECODER_OUTPUTS), {"decoder_input_ids": tokens[:, None], **encoded, **cache}
        )
        return logits

    def step_logits(self, input_ids: Any, attention_mask: Any, decoder_input_ids: Any) -> np.ndarray:
        """Teacher-forced logits (B, T, V) of `decoder_input_ids` (B, T), one cached step per position."""
        encoded = self.encode(input_ids, attention_mask)
        decoder_input_ids = np.asarray(decoder_input_ids, dtype=np.int64)
        cache = self._empty_cache(decoder_input_ids.shape[0])
        return np.stack([self._step(column, encoded, cache) for column in decoder_input_ids.T], axis=1)

    def generate(
        self, input_ids: Any, attention_mask: Any | None = None, max_new_tokens: int | None = None
    ) -> np.ndarray:
        """Greedy decoding of input_ids (B, S) (numpy or torch, right-padded, attention_mask 1 = token) with the
        folder's generation config. Returns (B, 1 + n) int64 token ids beginning with the decoder start token and
        padded after EOS: what our `model.generate(input_ids, attention_mask=..., num_beams=1, do_sample=False,
        max_new_tokens=max_new_tokens)` returns. `max_new_tokens` None: the config's limit (its
        `max_new_tokens`, else its `max_length` - 1; §6.1's `max_new_tokens_offset` per sentence)."""
        config = self.generation_config
        encoded = self.encode(input_ids, attention_mask)
        mask = encoded["encoder_attention_mask"]
        batch = mask.shape[0]
        eos = np.asarray(config.eos_token_id if config.eos_token_id is not None else [], dtype=np.int64).reshape(-1)
        limits, cap = self._limits(mask, max_new_tokens)
        if cap + 1 > self.config["max_positions"]:
            raise ValueError(
                f"Decoding up to {cap} new tokens needs {cap + 1} positions, more than the "
                f"{self.config['max_positions']} this export holds. Pass a smaller max_new_tokens, or export again "
                "with a larger max_positions (python -m conversion to-onnx --max-positions)."
            )
        banned = [ids[0] for ids in config.bad_words_ids or [] if len(ids) == 1]
        tokens = np.full((batch, 1), config.decoder_start_token_id, dtype=np.int64)
        finished = np.zeros(batch, dtype=bool)
        cache = self._empty_cache(batch)
        for step in range(cap):
            scores = self._step(tokens[:, -1], encoded, cache)
            if banned:
                scores[:, banned] = -np.inf
            # The last token a row may generate is EOS (§6.1's per-sentence limit; `forced_eos_token_id` at the cap).
            due = limits - 1 <= step
            if config.forced_eos_token_id is not None and step == cap - 1:
                due[:] = True
                forced = np.asarray(config.forced_eos_token_id, dtype=np.int64).reshape(-1)
            else:
                forced = eos
            if due.any() and forced.size:
                scores[due] = -np.inf
                scores[np.ix_(due, forced)] = 0.0
            chosen = scores.argmax(-1)
            if eos.size:  # finished rows get padding (transformers' default pad: the first EOS)
                pad = config.pad_token_id if config.pad_token_id is not None else eos[0]
                chosen = np.where(finished, pad, chosen)
                finished |= np.isin(chosen, eos)
            tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
            if finished.all():
                break
        return tokens

    def _limits(self, mask: np.ndarray, max_new_tokens: int | None) -> tuple[np.ndarray, int]:
        """Per-row limits (EOS forced at the last token; a huge value where none) and the number of steps."""
        config = self.generation_config
        offset = getattr(config, "max_new_tokens_offset", None)
        unlimited = np.iinfo(np.int64).max
        limits = np.full(mask.shape[0], unlimited, dtype=np.int64)
        if offset is not None:
            limits = mask.sum(-1).astype(np.int64) + offset
        # generate()'s precedence: the call's limit, §6.1's per-sentence limit, the config's, transformers' default.
        if max_new_tokens is not None:
            cap = max_new_tokens
        elif offset is not None:
            cap = int(limits.max())
        elif config.max_new_tokens is not None:
            cap = config.max_new_tokens
        elif config.max_length is not None:
            cap = config.max_length - 1  # the decoder prompt is the start token
        else:  # 20 new tokens, within the model's max_position_embeddings
            cap = min(20, self.config["max_position_embeddings"] - 1)
        return limits, cap

    def translate(self, sentences: Sequence[str], max_new_tokens: int | None = None) -> list[str]:
        """Tokenize `sentences` with the folder's tokenizer, `generate`, and decode with the target tokenizer."""
        if self._tokenizers is None:
            source = AutoTokenizer.from_pretrained(self.folder)
            target_folder = self.folder / TARGET_TOKENIZER
            self._tokenizers = (
                source,
                AutoTokenizer.from_pretrained(target_folder) if target_folder.is_dir() else source,
            )
        source, target = self._tokenizers
        batch = source(list(sentences), return_tensors="np", padding=True)
        ids = self.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens)
        return target.batch_decode(ids, skip_special_tokens=True)


# ------------------------------------------------------------------------------------------------ the command
@dataclass(frozen=True, kw_only=True)
class OnnxOptions(CommonOptions):
    """An export: `source` is a folder of our model (config.json, weights, tokenizer). Its graphs are float32, so the
    verification has the float32 bound only: onnxruntime and torch differ by summation order alone."""

    max_positions: int = DEFAULT_MAX_POSITIONS  # rows of the sinusoid tables: the longest source and output


def load_source(source: Path) -> VanillaTransformerForConditionalGeneration:
    """Our model from `source` in float32 eval mode; a missing folder or another model type is one clear error."""
    config_path = source / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"`source` {source} has no config.json; pass a folder written by train or by a converter."
        )
    config = read_json(config_path)
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != "vanilla_transformer":
        raise ValueError(
            f"`source` {source} holds a {model_type!r} model, not 'vanilla_transformer'; export MarianMTModel and "
            "other transformers models with optimum-cli export onnx."
        )
    check_our_folder(source, config, "`source`", tokenizer=False)  # damaged files named, before anything is loaded
    return VanillaTransformerForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()


def check_generation_config(config: GenerationConfig) -> None:
    """Refuse greedy-decoding settings `OnnxTranslator.generate` does not implement, naming the first."""
    for name, neutral in UNSUPPORTED_GREEDY_SETTINGS.items():
        value = getattr(config, name, neutral)
        if value not in (neutral, None):
            raise NotImplementedError(
                f"generation_config.json sets {name}={value!r}, which the ONNX greedy decoder does not implement; "
                f"remove it (set {neutral!r}) from the source folder's generation_config.json to export."
            )
    if any(len(ids) != 1 for ids in config.bad_words_ids or []):
        raise NotImplementedError(
            f"generation_config.json sets bad_words_ids={config.bad_words_ids!r}; the ONNX greedy decoder bans "
            "single tokens only. Remove the longer sequences to export."
        )


def copy_tokenizer(source: Path, folder: Path) -> list[str]:
    """Copy the source folder's tokenizer files (and its target tokenizer subfolder) as they are."""
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copy2(source / name, folder / name)
    if (source / TARGET_TOKENIZER).is_dir():
        shutil.copytree(source / TARGET_TOKENIZER, folder / TARGET_TOKENIZER)
        copied.append(TARGET_TOKENIZER)
    return copied


def verify(model: VanillaTransformerForConditionalGeneration, folder: Path, atol: float) -> float:
    """Teacher-forced logits of the ONNX graphs in `folder` (onnxruntime, through the cache) against ours, on
    `sample_inputs`; raises ValueError above `atol`. Returns the max-abs difference."""
    inputs = sample_inputs(model.config)
    with torch.no_grad():
        expected = model(**inputs).logits
    found = OnnxTranslator(folder).step_logits(**{name: tensor.numpy() for name, tensor in inputs.items()})
    return verify_logits(expected, torch.from_numpy(found), atol, what="ONNX (onnxruntime) vs ours, fp32")


def onnx_config(config: VanillaTransformerConfig, max_positions: int) -> dict[str, Any]:
    """`onnx_config.json`: the graphs' file names and what `OnnxTranslator` needs to shape the cache and the limits."""
    return {
        "format": "hf_vanilla_transformer to-onnx",
        "encoder": ENCODER_FILE,
        "decoder": DECODER_FILE,
        "decoder_layers": config.decoder_layers,
        "num_heads": config.decoder_attention_heads,
        "head_dim": config.d_model // config.decoder_attention_heads,
        "max_positions": max_positions,
        "vocab_size": config.decoder_vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
    }


def decoding_note(config: GenerationConfig) -> str:
    """What `OnnxTranslator.generate`, greedy decoding, keeps of the folder's decoding defaults: the model card's
    note below its decoding table."""
    offset = getattr(config, "max_new_tokens_offset", None)
    kept = [
        "the start, EOS and pad ids",
        f"§6.1's per-sentence length limit (source length + {offset})" if offset is not None else "the length limit",
    ]
    if config.forced_eos_token_id is not None:
        kept.append("the EOS forced at the limit")
    if config.bad_words_ids:
        kept.append("the banned tokens (`bad_words_ids`)")
    note = f"`OnnxTranslator.generate` decodes greedily with these defaults, keeping {'; '.join(kept)}."
    if (config.num_beams or 1) > 1:
        penalty = "GNMT " if getattr(config, "length_penalty_type", None) == "gnmt" else ""
        note += (
            f" Beam search (beam size {config.num_beams}, {penalty}length penalty α {config.length_penalty:g}) is "
            "not part of the export: its output is the greedy one, which may differ from the beam's."
        )
    return note


USAGE = """# pip install 'hf_vanilla_transformer[onnx]'  (onnxruntime; OnnxTranslator is the decoding loop)
from conversion.onnx import OnnxTranslator

translator = OnnxTranslator("{folder}")  # onnxruntime sessions of encoder.onnx and decoder.onnx
print(translator.translate(["A sentence to translate."]))
# token ids, as model.generate(num_beams=1, do_sample=False) returns them:
# translator.generate(input_ids, attention_mask, max_new_tokens=50)"""
NOTES = [
    "`encoder.onnx`: input_ids, attention_mask (batch, source) int64 -> encoder_hidden_states and every decoder "
    "layer's cross-attention keys and values, `cross_keys` / `cross_values` (layers, batch, heads, source, head_dim).",
    "`decoder.onnx`: one step. decoder_input_ids (batch, 1), encoder_hidden_states, encoder_attention_mask, "
    "cross_keys, cross_values, past_keys / past_values (layers, batch, heads, past, head_dim; past = 0 at the first "
    "step, float32) -> logits (batch, vocabulary) and present_keys / present_values (past + 1), the next step's past.",
    "Greedy decoding starts from the decoder start token, feeds each chosen token back with the present keys and "
    "values, and stops at EOS (finished rows are fed padding). The files need only onnxruntime, numpy and a "
    "tokenizer: `OnnxTranslator.generate` in hf_vanilla_transformer's `conversion/onnx.py` is the loop to copy.",
    "`onnx_config.json` holds the cache's shape and `max_positions`; `config.json` is the model's, for reference.",
]


def convert(options: OnnxOptions) -> Finished:
    """Export, verify against our model, and write OUTPUT_DIR with its model card (`finish`: nothing is written
    there on a failure)."""
    check_output(options)
    _onnx_modules()
    if options.max_positions < 2:
        raise OptionError(
            f"`max_positions={options.max_positions}` must be at least 2 (the start token and one more); the "
            f"default is {DEFAULT_MAX_POSITIONS}."
        )
    model = load_source(options.source)
    check_generation_config(model.generation_config)
    max_positions = position_limit(model, options.max_positions)

    def write_model(folder: Path) -> None:
        export_graphs(model, folder, max_positions)
        config = onnx_config(model.config, max_positions)
        (folder / ONNX_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        model.config.to_json_file(folder / "config.json")  # for reference: the graphs need no code file
        model.generation_config.save_pretrained(folder)

    check = SourceCheck(
        "the PyTorch model",
        lambda exported, folder: {"fp32": verify(exported, folder, options.atol_fp32)},
        evidence="sample inputs (three right-padded rows), teacher-forced step by step through the cache",
    )
    converted = Converted(
        model,
        model.generation_config,
        facts={
            "Source": f"hf_vanilla_transformer folder `{options.source}`",
            "Graphs": "`encoder.onnx` and `decoder.onnx` (one cached step), float32, opset 20 (torch.onnx, dynamo)",
            "Longest source and output": f"{max_positions} positions"
            + (" (the learned table)" if model.config.position_embedding_type == "learned" else ""),
        },
        notes=list(NOTES),
        source_metadata=source_card_metadata(options.source),
    )
    card = CardText(
        "exported to ONNX",
        f"Exported with `python -m conversion to-onnx` from the hf_vanilla_transformer folder `{options.source}` "
        "for onnxruntime: the encoder and one cached decoder step. The architecture table is the source model's, "
        "which the graphs compute.",
        USAGE.format(folder=options.output_dir),
        decoding_note=decoding_note(model.generation_config),
        library_name="onnx",
        tags=("onnx",),
    )
    return finish(
        converted,
        options,
        check,
        card,
        write_model=write_model,
        extra_files=lambda folder: copy_tokenizer(options.source, folder),
    )


__all__ = ["DecoderStepGraph", "EncoderGraph", "OnnxOptions", "OnnxTranslator", "convert", "export_graphs", "verify"]
