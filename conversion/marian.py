"""A Hugging Face MarianMTModel / OPUS-MT folder -> hf_vanilla_transformer; `to-marian` goes back (docs/conversion.md).

`python -m conversion marian SRC OUT` imports a `MarianMTModel` folder. Our module names are Marian's, so the key map
is the identity except `final_logits_bias` -> `lm_head.bias`; the model keeps Marian's token ids, activation (OPUS-MT:
swish) and [sin | cos] sinusoids (`sinusoidal_layout="concat"`). Tokenizer files are copied as they are.

`python -m conversion to-marian SRC OUT` exports ours to a `MarianMTModel` folder. Marian's [sin | cos] table is the
paper's interleaved one (§3.5) up to a fixed permutation P of the d_model axis (2i -> i, 2i+1 -> d/2 + i), so an
interleaved model is exported exactly by permuting every weight that reads or writes the residual stream. LayerNorm
commutes with P and the heads are untouched because the Q/K/V outputs are not permuted.

The exported folder is also meant for CTranslate2's `TransformersConverter`, whose MarianMTLoader assumes two Marian
conventions: <pad> is the last token id (it drops the last vocabulary row) and the decoder starts from a zero vector
(`start_from_zero_embedding`) instead of the start token's embedding. The exporter therefore moves <pad> to the last
id, remapping the weights and the tokenizer (`keep_token_ids` opts out), and refuses a non-zero start embedding
(`allow_nonzero_start_embedding` opts out: Marian in transformers stays exact, CTranslate2 does not). Models
trained here keep that row at zero (hf_vanilla_transformer/training/start_embedding.py), so they export without the
flag. The exported generation_config.json keeps our beam size and α, and sets `max_length` to the position table's
size where ours limits each sentence to its source length + 50 (§6.1); the card says which parts of §6.1 decoding
MarianMTModel and CTranslate2 cannot express (GNMT's penalty, the source-relative limit).

Both directions run `MarianMTModel` and our model on the same inputs and refuse a logit difference above `atol`
(computed in float64) or `atol_fp32` (in float32). Weights are written in float32. `convert(MarianOptions(SOURCE,
OUTPUT_DIR))` imports, `export(ToMarianOptions(SOURCE, OUTPUT_DIR, ...))` exports.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, MarianConfig, MarianMTModel, PreTrainedModel

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.inference.loading import model_folder
from hf_vanilla_transformer.model.generation_vanilla_transformer import PAPER_MAX_NEW_TOKENS_OFFSET
from hf_vanilla_transformer.model.modeling_vanilla_transformer import sinusoid_table
from hf_vanilla_transformer.training.start_embedding import start_embedding_max
from model_card import source_card_metadata

from ._common import (
    CardText,
    Converted,
    Finished,
    KeyRule,
    SourceCheck,
    SourceOptions,
    apply_key_map,
    check_output,
    finish,
    load_with_key_map,
    sample_inputs,
    usage_snippet,
    verify_logits,
)


@dataclass(frozen=True, kw_only=True)
class MarianOptions(SourceOptions):
    """An import: `source` is a MarianMTModel / OPUS-MT folder (config.json, weights, tokenizer)."""


@dataclass(frozen=True, kw_only=True)
class ToMarianOptions(SourceOptions):
    """An export: `source` is a folder of our model (config.json, weights, tokenizer)."""

    keep_token_ids: bool = False  # keep our ids instead of moving <pad> last (CTranslate2 then cannot read it)
    allow_nonzero_start_embedding: bool = False  # export although CTranslate2 would start from another vector


# The module names are Marian's by design, so most weights keep their name and shape in both directions.
_LAYER = r"model\.(?:encoder|decoder)\.layers\.\d+\."
SAME_NAMES: list[KeyRule] = [
    (r"model\.shared\.weight", r"\g<0>"),
    (r"model\.(?:encoder|decoder)\.embed_tokens\.weight", r"\g<0>"),
    (rf"{_LAYER}(?:self_attn|encoder_attn)\.(?:q|k|v|out)_proj\.(?:weight|bias)", r"\g<0>"),
    (rf"{_LAYER}(?:self_attn|encoder_attn|final)_layer_norm\.(?:weight|bias)", r"\g<0>"),
    (rf"{_LAYER}fc[12]\.(?:weight|bias)", r"\g<0>"),
    (r"lm_head\.weight", r"\g<0>"),
]
# Marian stores its sinusoids as a frozen weight; ours are recomputed, so the table is compared, then dropped.
MARIAN_POSITIONS = r"model\.(?:encoder|decoder)\.embed_positions\.weight"
# Marian's output bias is the `final_logits_bias` buffer, (1, V); ours is the `lm_head` bias, (V,).
MARIAN_TO_VANILLA: list[KeyRule] = [(r"final_logits_bias", "lm_head.bias"), (MARIAN_POSITIONS, None), *SAME_NAMES]
VANILLA_TO_MARIAN: list[KeyRule] = [(r"lm_head\.bias", "final_logits_bias"), *SAME_NAMES]

# The axis of each of our weights that runs along the residual stream (d_model), permuted by P on export. Q/K/V and
# fc1 read the stream (input columns), out_proj and fc2 write it (output rows and bias), LayerNorm acts on it.
RESIDUAL_AXIS: list[tuple[str, int]] = [
    (r"(?:shared|embed_tokens)\.weight$", 1),
    (r"^lm_head\.weight$", 1),
    (r"[qkv]_proj\.weight$", 1),
    (r"fc1\.weight$", 1),
    (r"(?:out_proj|fc2)\.(?:weight|bias)$", 0),
    (r"layer_norm\.(?:weight|bias)$", 0),
]
# The axis of each weight that runs along the vocabulary, permuted when <pad> moves to the last id.
VOCAB_AXIS: list[tuple[str, int]] = [(r"(?:shared|embed_tokens)\.weight$", 0), (r"^lm_head\.(?:weight|bias)$", 0)]

# Our settings that `MarianMTModel` has no field for, with the only value it implements.
MARIAN_FIXED: dict[str, object] = {
    "position_embedding_type": "sinusoidal",
    "position_offset": 0,
    "normalize_before": False,
    "add_final_layer_norm": False,
    "layer_norm_eps": 1e-5,  # Marian's `nn.LayerNorm(d_model)` default
}
# Fields copied as they are between the two configs (token ids are handled separately, they may be remapped).
SHARED_FIELDS = (
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
    "max_position_embeddings",
    "init_std",
)
TOKEN_ID_FIELDS = ("bos_token_id", "pad_token_id", "eos_token_id", "decoder_start_token_id")
# Generation settings that hold token ids (remapped with the vocabulary) and ours that Marian's generate() lacks.
GENERATION_ID_FIELDS = (
    *TOKEN_ID_FIELDS,
    "forced_bos_token_id",
    "forced_eos_token_id",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
)
VANILLA_ONLY_GENERATION = ("length_penalty_type", "max_new_tokens_offset")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "target_vocab.json",
    "source.spm",
    "target.spm",
    "merges.txt",
)


def permute_axes(
    state_dict: dict[str, torch.Tensor], table: list[tuple[str, int]], index: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Return `state_dict` with `tensor.index_select(axis, index)` applied to every key that `table` names."""
    out = {}
    for key, tensor in state_dict.items():
        axis = next((axis for pattern, axis in table if re.search(pattern, key)), None)
        out[key] = tensor if axis is None else tensor.index_select(axis, index)
    return out


def interleaved_to_concat(d_model: int) -> torch.Tensor:
    """P as a gather index: concat[..., j] = interleaved[..., index[j]], i.e. index = [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def pad_last_order(vocab_size: int, pad_token_id: int) -> torch.Tensor:
    """Gather index that moves <pad> to the last id and shifts the ids after it down by one."""
    others = [i for i in range(vocab_size) if i != pad_token_id]
    return torch.tensor([*others, pad_token_id])


def remap_ids(value: object, new_id: torch.Tensor) -> object:
    """Map every token id in an int, or a (nested) list of ints, through `new_id` (old id -> new id)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(new_id[value])
    if isinstance(value, list):
        return [remap_ids(item, new_id) for item in value]
    return value


@torch.no_grad()
def compare(
    reference: PreTrainedModel,
    candidate: PreTrainedModel,
    atol: float,
    atol_fp32: float,
    what: str,
    new_id: torch.Tensor | None = None,
) -> dict[str, float]:
    """Check that `candidate` computes `reference`'s logits on `sample_inputs`; `new_id` maps the reference's token
    ids to the candidate's (<pad> moved). Float64 within `atol` tests the conversion itself; float32 within `atol_fp32`
    what users will see: the residual-stream permutation reorders every sum, which alone moves float32 logits by
    ~2e-6 on tiny random models and ~6e-5 on a random base-size one (init_std 0.1). Returns both differences."""
    inputs = sample_inputs(reference.config)
    candidate_inputs, columns = inputs, slice(None)
    if new_id is not None:
        candidate_inputs = {**inputs, **{key: new_id[inputs[key]] for key in ("input_ids", "decoder_input_ids")}}
        columns = new_id[: reference.config.decoder_vocab_size]  # the candidate's column of each reference id
    models = {"fp64": (copy.deepcopy(reference).double(), copy.deepcopy(candidate).double())}
    models["fp32"] = (reference, candidate)
    diffs = {}
    for dtype, tolerance in (("fp64", atol), ("fp32", atol_fp32)):
        expected = models[dtype][0].eval()(**inputs).logits
        actual = models[dtype][1].eval()(**candidate_inputs).logits[..., columns]
        diffs[dtype] = verify_logits(expected, actual, tolerance, what=f"{what}, {dtype}")
    return diffs


# ----------------------------------------------------------------------------------------------------------- import
def vanilla_config_from_marian(config: MarianConfig) -> VanillaTransformerConfig:
    """Our config for a Marian one: [sin | cos] positions, the output bias, Marian's token ids and activation."""
    refused = {"is_decoder": False, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0}
    for name, supported in refused.items():
        if getattr(config, name) != supported:
            raise NotImplementedError(
                f"Marian `{name}={getattr(config, name)!r}` is not supported (only {supported})."
            )
    fields = {name: getattr(config, name) for name in (*SHARED_FIELDS, *TOKEN_ID_FIELDS)}
    if config.share_encoder_decoder_embeddings:
        fields["decoder_vocab_size"] = config.vocab_size  # Marian ignores decoder_vocab_size when sharing
    try:
        return VanillaTransformerConfig(**fields, lm_head_bias=True, sinusoidal_layout="concat")
    except ValueError as error:  # e.g. an activation or a list of EOS ids that our config does not offer
        raise NotImplementedError(f"This Marian config has no equivalent in ours: {error}") from error


def marian_to_vanilla(marian: MarianMTModel) -> VanillaTransformerForConditionalGeneration:
    """Our model holding the weights of `marian` (float32); the sinusoids are compared, not copied."""
    config = vanilla_config_from_marian(marian.config)
    weights = {key: tensor.float() for key, tensor in marian.state_dict().items()}
    table = sinusoid_table(config.max_position_embeddings, config.d_model, layout="concat")
    for key in [key for key in weights if re.fullmatch(MARIAN_POSITIONS, key)]:
        if not torch.allclose(weights[key], table, atol=1e-6):
            raise NotImplementedError(f"`{key}` is not Marian's sinusoid table; learned positions are not supported.")
    weights["final_logits_bias"] = weights["final_logits_bias"].reshape(-1)
    model = VanillaTransformerForConditionalGeneration(config)
    # Marian's copies of the weights our model ties map onto the tied weight, so the key map checks that they agree.
    tied: list[KeyRule] = [(re.escape(alias), origin) for alias, origin in (model._tied_weights_keys or {}).items()]
    load_with_key_map(model, weights, tied + MARIAN_TO_VANILLA)
    return model.eval()


def load_marian(source: Path) -> MarianMTModel:
    """`MarianMTModel.from_pretrained`, refusing other architectures and weights it would initialise at random."""
    config_file = Path(source) / "config.json"
    if config_file.is_file():  # a local folder: another model type is refused before its auto_map could name code
        try:
            model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
        except (ValueError, AttributeError) as error:
            raise ValueError(f"{config_file} is not a JSON object ({error}). Copy or download it again.") from None
        if model_type != MarianConfig.model_type:
            raise ValueError(f"{source} holds a model of type {model_type!r}, not a Marian (MarianMTModel) config.")
    config = AutoConfig.from_pretrained(source, trust_remote_code=False)  # a Marian folder needs no code of its own
    if not isinstance(config, MarianConfig):
        raise ValueError(f"{source} holds a `{type(config).__name__}`, not a Marian (MarianMTModel) config.")
    marian, info = MarianMTModel.from_pretrained(source, dtype=torch.float32, output_loading_info=True)
    problems = {kind: sorted(info[kind]) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        raise ValueError(f"{source} does not load cleanly into MarianMTModel: {problems}.")
    return marian.eval()


def copy_tokenizer(source: Path, output: Path) -> list[str]:
    """Copy the tokenizer files as they are (a MarianTokenizer needs `sentencepiece` to load them)."""
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copy(source / name, output / name)
    return copied


def convert(options: MarianOptions) -> Finished:
    """Import a Marian folder, verify it against MarianMTModel, write our folder and check that it reloads."""
    check_output(options)
    marian = load_marian(options.source)
    model = marian_to_vanilla(marian)
    converted = Converted(
        model,
        GenerationConfig.from_dict(marian.generation_config.to_dict()),
        facts={"Source": f"MarianMTModel folder `{options.source}`"},
        notes=[
            "Token ids, special tokens and the generation config are Marian's (<pad> starts the decoder).",
            "The tokenizer files are copied as they are; a MarianTokenizer needs `pip install sentencepiece`.",
        ],
        source_metadata=source_card_metadata(options.source),
    )
    check = SourceCheck(
        "MarianMTModel",
        lambda ours, folder: compare(marian, ours, options.atol, options.atol_fp32, "MarianMTModel vs ours"),
        evidence="sample inputs (three right-padded rows)",
    )
    card = CardText(
        "Marian in hf_vanilla_transformer",
        f"Converted with `python -m conversion marian` from the MarianMTModel folder `{options.source}`.",
        usage_snippet(options.output_dir, "A sentence to translate."),
    )
    return finish(converted, options, check, card, extra_files=lambda folder: copy_tokenizer(options.source, folder))


# ----------------------------------------------------------------------------------------------------------- export
def marian_config_from_vanilla(config: VanillaTransformerConfig, new_id: torch.Tensor) -> MarianConfig:
    """The Marian config of our config, with token ids mapped through `new_id` (our id -> Marian id)."""
    for name, supported in MARIAN_FIXED.items():
        if getattr(config, name) != supported:
            raise NotImplementedError(
                f"MarianMTModel cannot represent `{name}={getattr(config, name)!r}` (it has only {supported!r})."
            )
    if config.sinusoidal_layout == "fairseq":
        raise NotImplementedError(
            "MarianMTModel cannot represent `sinusoidal_layout='fairseq'`: its frequencies 10000^(-k/(d/2-1)) differ "
            "from Marian's (the paper's), so no permutation maps one table to the other."
        )
    fields = {name: getattr(config, name) for name in SHARED_FIELDS}
    ids = {name: remap_ids(getattr(config, name), new_id) for name in TOKEN_ID_FIELDS}
    # forced_eos_token_id: MarianConfig defaults to 0; our model forces nothing.
    return MarianConfig(**fields, **ids, forced_eos_token_id=None)


def vanilla_to_marian(
    model: VanillaTransformerForConditionalGeneration, move_pad_last: bool = True
) -> tuple[MarianMTModel, torch.Tensor]:
    """`MarianMTModel` computing the same function as `model` (float32). Returns it and the token id map `new_id`
    (our id -> Marian id: the identity, or <pad> moved to the last id when `move_pad_last`)."""
    config = model.config
    vocab_size, pad = config.vocab_size, config.pad_token_id
    move = move_pad_last and pad != vocab_size - 1
    if move and config.decoder_vocab_size != vocab_size:
        raise NotImplementedError(
            "Moving <pad> to the last id needs one vocabulary; this model has separate source and target "
            "vocabularies. Pass move_pad_last=False to keep our token ids (CTranslate2's MarianMTLoader then cannot "
            "read the export)."
        )
    order = pad_last_order(vocab_size, pad) if move else torch.arange(max(vocab_size, config.decoder_vocab_size))
    new_id = torch.argsort(order)
    marian = MarianMTModel(marian_config_from_vanilla(config, new_id))
    weights = {key: tensor.float() for key, tensor in model.state_dict().items()}
    if config.sinusoidal_layout == "interleaved":
        weights = permute_axes(weights, RESIDUAL_AXIS, interleaved_to_concat(config.d_model))
    if move:
        weights = permute_axes(weights, VOCAB_AXIS, order)
    weights["lm_head.bias"] = weights.get("lm_head.bias", torch.zeros(config.decoder_vocab_size)).reshape(1, -1)
    own = marian.state_dict()
    expected = {key: tensor.shape for key, tensor in own.items() if not re.fullmatch(MARIAN_POSITIONS, key)}
    weights = apply_key_map(weights, VANILLA_TO_MARIAN, expected)
    weights |= {key: own[key] for key in own if key not in expected}  # Marian's own sinusoids, computed at init
    marian.load_state_dict(weights, strict=True)
    marian.generation_config = marian_generation_config(model.generation_config, config, new_id)
    return marian.eval(), new_id


def marian_generation_config(
    generation_config: GenerationConfig, config: VanillaTransformerConfig, new_id: torch.Tensor
) -> GenerationConfig:
    """The export's generation config: ours with the token ids mapped through `new_id`, less the settings
    `MarianMTModel.generate()` lacks (`VANILLA_ONLY_GENERATION`), plus a length limit when ours sets none: without
    one transformers stops every output at 20 tokens. The per-example limit (source length + offset) becomes
    `max_length` = `max_position_embeddings`, the longest output Marian's position table holds."""
    generation = {k: v for k, v in generation_config.to_diff_dict().items() if k not in VANILLA_ONLY_GENERATION}
    generation |= {k: remap_ids(generation[k], new_id) for k in GENERATION_ID_FIELDS if k in generation}
    if generation.get("max_length") is None and generation.get("max_new_tokens") is None:
        generation["max_length"] = config.max_position_embeddings
    return GenerationConfig.from_dict(generation)


def decoding_note(generation_config: GenerationConfig, exported: GenerationConfig) -> str:
    """The card's note below the decoding table: which of the source's §6.1 settings MarianMTModel and CTranslate2
    keep, and which they cannot express."""
    beams, alpha = exported.num_beams or 1, exported.length_penalty
    limit = (
        f"`max_length` {exported.max_length}"
        if exported.max_new_tokens is None
        else f"`max_new_tokens` {exported.max_new_tokens}"
    )
    lost = []
    if getattr(generation_config, "length_penalty_type", None) == "gnmt":
        lost.append(f"GNMT's length penalty ((5 + |Y|) / 6)^α becomes transformers' |Y|^α with the same α ({alpha:g})")
    offset = getattr(generation_config, "max_new_tokens_offset", None)
    if offset is None and generation_config.max_length is None and generation_config.max_new_tokens is None:
        offset = PAPER_MAX_NEW_TOKENS_OFFSET  # what our generate() applies when nothing sets a length
    if offset is not None:
        lost.append(f"the per-sentence limit (source length + {offset}, EOS forced there) becomes the fixed {limit}")
    note = f"`MarianMTModel.generate()` reads these defaults: beam size {beams}, {limit}."
    if lost:
        note += f" Of §6.1's decoding it cannot express: {'; '.join(lost)}; outputs may therefore differ from ours."
    return note + (
        " CTranslate2 reads no generation config: pass `beam_size`, `length_penalty` (|Y|^α as well) and "
        "`max_decoding_length` (a fixed limit, default 256) to `translate_batch`; it has no GNMT penalty and no "
        "limit relative to the source length."
    )


def remap_tokenizer_json(data: dict, new_id: torch.Tensor) -> dict:
    """A `tokenizers` tokenizer.json with every token id mapped through `new_id`."""
    for token in data.get("added_tokens", []):
        token["id"] = int(new_id[token["id"]])
    model = data["model"]
    if model["type"] in ("WordLevel", "BPE", "WordPiece"):
        model["vocab"] = {token: int(new_id[i]) for token, i in model["vocab"].items()}
    elif model["type"] == "Unigram":
        pieces = [None] * len(model["vocab"])
        for old, piece in enumerate(model["vocab"]):
            pieces[int(new_id[old])] = piece
        model["vocab"] = pieces
        model["unk_id"] = remap_ids(model.get("unk_id"), new_id)
    else:
        raise NotImplementedError(f"Cannot remap the ids of a `{model['type']}` tokenizer; pass `keep_token_ids`.")

    def processor(node: object) -> object:
        # Post-processors name their special tokens with ids: TemplateProcessing `ids` lists, Bert/Roberta pairs.
        if isinstance(node, dict):
            return {k: remap_ids(v, new_id) if k == "ids" else processor(v) for k, v in node.items()}
        if isinstance(node, list) and len(node) == 2 and isinstance(node[0], str) and isinstance(node[1], int):
            return [node[0], int(new_id[node[1]])]
        return [processor(item) for item in node] if isinstance(node, list) else node

    data["post_processor"] = processor(data.get("post_processor"))
    return data


def write_tokenizer(source: Path, output: Path, new_id: torch.Tensor) -> list[str]:
    """Copy the tokenizer files, with the token ids mapped through `new_id`, and check the result id by id."""
    names = copy_tokenizer(source, output)
    if not names or torch.equal(new_id, torch.arange(len(new_id))):
        return names
    for name in names:
        path = output / name
        if name == "tokenizer.json":
            data = remap_tokenizer_json(json.loads(path.read_text()), new_id)
        elif name in ("vocab.json", "target_vocab.json", "added_tokens.json"):
            data = {token: int(new_id[i]) for token, i in json.loads(path.read_text()).items()}
        elif name == "tokenizer_config.json":
            data = json.loads(path.read_text())
            decoder = data.get("added_tokens_decoder", {})
            data["added_tokens_decoder"] = {str(int(new_id[int(i)])): token for i, token in decoder.items()}
        else:
            continue
        path.write_text(json.dumps(data, ensure_ascii=False, indent=2))
    before = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    after = AutoTokenizer.from_pretrained(output, trust_remote_code=False)
    for old in range(min(len(before), len(new_id))):
        if before.convert_ids_to_tokens(old) != after.convert_ids_to_tokens(int(new_id[old])):
            raise ValueError(f"Remapping the tokenizer of {source} failed at id {old}; pass `keep_token_ids`.")
    return names


def export(options: ToMarianOptions) -> Finished:
    """Export our folder to a MarianMTModel folder verified against our model, and check that it reloads exactly."""
    check_output(options)
    source, output_dir = options.source, options.output_dir
    model_folder(source, None, name="`source`", tokenizer=False)  # damaged files named, before anything is loaded
    model = VanillaTransformerForConditionalGeneration.from_pretrained(source).float().eval()
    start = start_embedding_max(model)
    if start and not options.allow_nonzero_start_embedding:
        raise ValueError(
            f"The decoder start token ({model.config.decoder_start_token_id}) has a non-zero embedding (max |x| = "
            f"{start:.3e}). Marian-based runtimes (CTranslate2) start decoding from a zero vector and would translate "
            "differently. Train or fine-tune with decoder_start_embedding='zero' (the trainer's default), or pass "
            "`allow_nonzero_start_embedding`."
        )
    pad, vocab_size = model.config.pad_token_id, model.config.vocab_size
    moves = not options.keep_token_ids and pad != vocab_size - 1
    if moves and not any((source / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"`source` {source} has no tokenizer whose ids could follow <pad> to the last id; pass `keep_token_ids`."
        )
    if moves and model.config.decoder_vocab_size != vocab_size:  # vanilla_to_marian's refusal, in these terms
        raise NotImplementedError(
            f"Moving <pad> to the last id needs one vocabulary; `source` {source} has separate source and target "
            "vocabularies. Pass `keep_token_ids` (CTranslate2's MarianMTLoader then cannot read the export)."
        )
    marian, new_id = vanilla_to_marian(model, move_pad_last=moves)
    facts = {
        "Source": f"hf_vanilla_transformer folder `{source}`",
        "Positions": "interleaved sinusoids (§3.5), exported through the residual-stream permutation"
        if model.config.sinusoidal_layout == "interleaved"
        else "[sin | cos] sinusoids, as Marian's",
        "Token ids": f"<pad> moved from {pad} to {vocab_size - 1} (ids above {pad} shifted down by one)"
        if moves
        else "unchanged",
    }
    notes = ["CTranslate2 starts the decoder from a zero vector and never generates <pad>."]
    check = SourceCheck(
        "the source model",
        lambda exported, folder: compare(
            model, exported, options.atol, options.atol_fp32, "ours vs MarianMTModel", new_id
        ),
        evidence="sample inputs (three right-padded rows)",
    )
    ct2 = f"# CTranslate2: ct2-transformers-converter --model {output_dir} --output_dir {output_dir.name}-ct2"
    card = CardText(
        "exported to MarianMTModel",
        f"Exported with `python -m conversion to-marian` from the hf_vanilla_transformer folder `{source}`; the "
        "architecture table is the source model's, which the export computes exactly.",
        usage_snippet(output_dir, "A sentence to translate.", model_class="MarianMTModel", after=[ct2]),
        decoding_note=decoding_note(model.generation_config, marian.generation_config),
    )
    converted = Converted(
        marian, marian.generation_config, facts=facts, notes=notes, source_metadata=source_card_metadata(source)
    )
    return finish(
        converted,
        options,
        check,
        card,
        card_config=model.config,
        extra_files=lambda folder: write_tokenizer(source, folder, new_id),
    )


__all__ = [
    "MarianOptions",
    "ToMarianOptions",
    "compare",
    "convert",
    "decoding_note",
    "export",
    "load_marian",
    "marian_generation_config",
    "marian_to_vanilla",
    "pad_last_order",
    "vanilla_to_marian",
    "write_tokenizer",
]
