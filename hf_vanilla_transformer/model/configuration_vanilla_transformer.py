"""Configuration of the Transformer of Vaswani et al. (2017), "Attention Is All You Need" (arXiv:1706.03762).

Field names are Hugging Face's Marian/BART names; the paper's symbols (N, d_model, d_ff, h, P_drop) are accepted
only by `VanillaTransformerConfig.from_paper` and the presets. Defaults are the paper's base model (Table 3).
Every departure from the paper is a field whose default is the paper's value and whose docstring says "Deviation:".
"""

import dataclasses
import difflib
import functools
from collections.abc import Callable
from typing import Any, ClassVar

from huggingface_hub.dataclasses import as_validated_field, strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import PretrainedConfig
from transformers.utils import TRANSFORMERS_DYNAMIC_MODULE_NAME

from .pipeline_vanilla_translation import VanillaTranslationPipeline

# Paper symbols that users tend to pass straight to the constructor; they would be silently stored otherwise.
PAPER_SYMBOLS = {
    "N": "encoder_layers/decoder_layers",
    "h": "encoder_attention_heads/decoder_attention_heads",
    "d_ff": "encoder_ffn_dim/decoder_ffn_dim",
    "P_drop": "dropout",
    "d_k": "d_model / encoder_attention_heads",
    "d_v": "d_model / encoder_attention_heads",
    "eps_ls": "label_smoothing_factor in the TrainingArguments",
}

# Presets in paper symbols (Table 3) plus Hugging Face field overrides.
PRESETS: dict[str, dict[str, Any]] = {
    # Table 3 "base": 65M parameters with a 37k shared vocabulary.
    "transformer-base": dict(N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1),
    # Table 3 "big", EN-DE: P_drop 0.3.
    "transformer-big": dict(N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3),
    # §6.1: the big EN-FR model used P_drop 0.1 instead of 0.3.
    "transformer-big-en-fr": dict(N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.1),
    # Small presets for CPU work; same architecture, smaller sizes (Table 3 row C explores such sizes).
    "transformer-small": dict(N=3, d_model=512, d_ff=2048, h=8, P_drop=0.3),
    "transformer-tiny": dict(N=3, d_model=256, d_ff=1024, h=4, P_drop=0.1),
    # Multi30k: 29,000 pairs overfit the base model. Deviations from the base model, chosen on Multi30k val:
    # 3+3 layers, d_model 256, d_ff 1024, 4 heads (3-4x cheaper per token, as good as base on this data);
    # P_drop 0.3 (0.1 overfits 29k pairs, about 1 BLEU worse). Its training recipe, the main job's defaults with
    # their reasons in cli.py: inverse_sqrt to a peak of 2e-3 after 400 updates (eq. (3)'s warmup of 4000 would last
    # 30 epochs here), batches of 4096 tokens per side, a joint 8k BPE (docs/runs/sweep.md: val only).
    "transformer-multi30k": dict(N=3, d_model=256, d_ff=1024, h=4, P_drop=0.3),
    # The model that ships with the package (hf_vanilla_transformer/pretrained): 4+4 layers, d_model 128, d_ff 256,
    # 4 heads, P_drop 0.3, 2.35M parameters with an 8k BPE (under 5 MB in fp16). On Multi30k it runs 1.5x the tokens
    # per second of transformer-multi30k and scored test_2016 39.86-40.03 after an hour on 2 cores
    # (docs/runs/sweep.md, "tiny").
    "transformer-multi30k-tiny": dict(N=4, d_model=128, d_ff=256, h=4, P_drop=0.3),
}

# Saved in config.json so that `pipeline("translation", model=dir, trust_remote_code=True)` finds the pipeline file
# saved beside the weights. The installed package registers the task with transformers instead (registration.py), so
# its config class drops the entry when loading (pipeline() would take the remote-code route and demand
# trust_remote_code if the config listed it); a copy loaded as remote code (a module of transformers' dynamic-module
# package) keeps it.
# The pipeline's module is imported here, relatively, so that `save_pretrained` copies its file with this one (the
# code files of a remote-code model are its modules and their relative imports): the file is in the folder before
# `save_pretrained(..., push_to_hub=True)` uploads it.
_PIPELINE = {
    "impl": f"{VanillaTranslationPipeline.__module__.rsplit('.', 1)[-1]}.{VanillaTranslationPipeline.__name__}",
    "pt": ["AutoModelForSeq2SeqLM"],
}
TRANSLATION_TASKS = ["translation"] + [
    f"translation_{src}_to_{tgt}" for src in ("en", "de", "fr") for tgt in ("en", "de", "fr") if src != tgt
]


class FieldError(ValueError):
    """A field validator's refusal; the config names the field in front of it (`strict_value_errors`)."""


@as_validated_field
def positive_int(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldError(f"must be a positive integer, got {value!r}.")


@as_validated_field
def non_negative_int(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FieldError(f"must be a non-negative integer, got {value!r}.")


@as_validated_field
def positive_number(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise FieldError(f"must be a positive number, got {value!r}.")


@as_validated_field
def true_or_false(value: Any) -> None:
    if not isinstance(value, bool):
        raise FieldError(f"must be True or False, got {value!r}.")


@as_validated_field
def token_id(value: Any) -> None:
    """The type of a special token id; `validate_token_ids` checks that it lies inside the vocabulary."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FieldError(f"must be an integer token id or None, got {value!r}.")


def probability(paper: str) -> Callable[..., Any]:
    """A dropout probability field; `paper` says what the paper uses."""

    @as_validated_field
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise FieldError(f"must be a probability in [0, 1), got {value!r}. The paper {paper}.")

    return check


def one_of(*choices: str) -> Callable[..., Any]:
    """A field taking one of `choices`."""

    @as_validated_field
    def check(value: Any) -> None:
        if value not in choices:
            raise FieldError(f"must be one of {choices}, got {value!r}.")

    return check


def strict_value_errors(cls: type) -> type:
    """`@strict`'s checks, with the errors this config has always raised: `@strict` wraps a validator's ValueError
    in a `StrictDataclass*ValidationError` (not a ValueError), and checks a field's type before the field's own
    validator can name the fix. Here each field's own validator runs first, and its refusal comes out as one
    ValueError naming the field, the value and the fix (callers and the command line rely on that); a class
    validator's ValueError (`validate_*`, transformers' own too) comes out as it was raised."""
    for validators in cls.__validators__.values():
        if len(validators) > 1:
            validators.append(validators.pop(0))  # the type check after the field's own validator
    strict_setattr, strict_validate = cls.__setattr__, cls.validate

    @functools.wraps(strict_setattr)
    def setattr_naming_the_field(self: Any, name: str, value: Any) -> None:
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            if isinstance(error.__cause__, FieldError):
                raise FieldError(f"`{name}` {error.__cause__}") from None
            raise

    @functools.wraps(strict_validate)
    def validate(self: Any) -> None:
        try:
            strict_validate(self)
        except StrictDataclassClassValidationError as error:
            if isinstance(error.__cause__, ValueError):
                raise error.__cause__ from None
            raise

    validate.__is_defined_by_strict_decorator__ = True  # a subclass may be decorated again
    cls.__setattr__, cls.validate = setattr_naming_the_field, validate
    return cls


# The most memory a model of this config may need, 2**46 bytes (64 TiB): more than any one machine holds (the largest
# servers have tens of TiB). A config asking more holds a value no machine can load (a `d_model` of 10**9), refused
# when the config is made, before the allocator refuses terabytes with a traceback.
MAX_MODEL_BYTES = 2**46
# Bytes a value of the model takes in the dtypes a config may record; float32 (this package's) where it records none.
_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@strict_value_errors
@strict
class VanillaTransformerConfig(PretrainedConfig):
    r"""Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    Defaults give the paper's base model (§3, Table 3): 6+6 post-LN layers, d_model 512, 8 heads, d_ff 2048,
    P_drop 0.1, ReLU, embeddings scaled by √d_model, one matrix shared by both embeddings and the pre-softmax
    projection (§3.4), interleaved sinusoidal positions (§3.5).

    Args:
        vocab_size: Size of the shared source/target vocabulary (§5.1: ~37000 BPE for EN-DE).
        decoder_vocab_size: Target vocabulary size; `None` means `vocab_size`. Deviation: a different value
            needs `share_encoder_decoder_embeddings=False` (separate vocabularies, as fairseq/OpenNMT models).
        d_model: Model width d_model (§3, 512 base).
        encoder_layers / decoder_layers: N (§3.1, 6).
        encoder_attention_heads / decoder_attention_heads: h (§3.2.2, 8); d_k = d_v = d_model / h.
        encoder_ffn_dim / decoder_ffn_dim: d_ff (§3.3, eq. (2), 2048).
        activation_function: eq. (2) uses ReLU. Deviation: any other value.
        dropout: P_drop (§5.4), applied to each sub-layer output and to embeddings + positions.
        attention_dropout: Deviation: dropout on attention probabilities (paper: none, 0.0).
        activation_dropout: Deviation: dropout after the FFN activation (paper: none, 0.0).
        scale_embedding: Multiply embeddings by √d_model (§3.4). Deviation: False.
        share_encoder_decoder_embeddings: One embedding matrix for source and target (§3.4). Deviation: False.
        tie_word_embeddings: The pre-softmax projection is the target embedding matrix (§3.4). Deviation: False.
        lm_head_bias: Deviation: a bias on the pre-softmax projection (Marian's `final_logits_bias`).
        max_position_embeddings: Length of the position table; sinusoids extend past it on demand.
        position_embedding_type: "sinusoidal" (§3.5). Deviation: "learned" (Table 3 row E, fairseq, BART).
        sinusoidal_layout: "interleaved" = §3.5 as written, PE(pos, 2i) = sin, PE(pos, 2i+1) = cos.
            Deviation: "concat" = Marian's [sin | cos] with the paper's frequencies; "fairseq" = [sin | cos] with
            frequencies 10000^(-k / (d_model/2 - 1)) (tensor2tensor's timing signal).
        position_offset: Deviation: index of the first position (fairseq: padding_idx + 1; paper: 0).
        normalize_before: Deviation: pre-LN, x + Sublayer(LayerNorm(x)) (tensor2tensor v2, Annotated Transformer);
            the paper is post-LN, LayerNorm(x + Sublayer(x)) (§3.1).
        add_final_layer_norm: Deviation: a LayerNorm after each stack (pre-LN models, `nn.Transformer`).
        layer_norm_eps: LayerNorm epsilon (not given in the paper; 1e-5 is PyTorch's and Marian's).
        layer_norm_type: "standard" = LayerNorm as cited by §3.1 (Ba et al., 2016), (x - mean) / sqrt(var + eps).
            Deviation: "annotated_std" = the Annotated Transformer's (x - mean) / (std + eps), unbiased std.
        init_std: Standard deviation of the normal initialisation of linear and embedding weights.
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values", "cache"]  # "cache" from transformers 5.24
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = positive_int(default=37000)
    decoder_vocab_size: int | None = None  # `vocab_size` when None (__post_init__); checked in validate_architecture
    d_model: int = positive_int(default=512)
    encoder_layers: int = positive_int(default=6)
    decoder_layers: int = positive_int(default=6)
    encoder_attention_heads: int = positive_int(default=8)
    decoder_attention_heads: int = positive_int(default=8)
    encoder_ffn_dim: int = positive_int(default=2048)
    decoder_ffn_dim: int = positive_int(default=2048)
    activation_function: str = one_of("relu", "gelu", "silu", "swish", "gelu_new")(default="relu")
    dropout: float | int = probability("uses 0.1 (§5.4)")(default=0.1)
    attention_dropout: float | int = probability("has none (0.0)")(default=0.0)
    activation_dropout: float | int = probability("has none (0.0)")(default=0.0)
    scale_embedding: bool = true_or_false(default=True)
    share_encoder_decoder_embeddings: bool = true_or_false(default=True)
    tie_word_embeddings: bool = true_or_false(default=True)
    lm_head_bias: bool = true_or_false(default=False)
    max_position_embeddings: int = positive_int(default=1024)
    position_embedding_type: str = one_of("sinusoidal", "learned")(default="sinusoidal")
    sinusoidal_layout: str = one_of("interleaved", "concat", "fairseq")(default="interleaved")
    position_offset: int = non_negative_int(default=0)
    normalize_before: bool = true_or_false(default=False)
    add_final_layer_norm: bool = true_or_false(default=False)
    layer_norm_eps: float | int = positive_number(default=1e-5)
    layer_norm_type: str = one_of("standard", "annotated_std")(default="standard")
    init_std: float | int = positive_number(default=0.02)
    use_cache: bool = true_or_false(default=True)
    is_encoder_decoder: bool = true_or_false(default=True)
    bos_token_id: int | None = token_id(default=0)
    pad_token_id: int | None = token_id(default=1)
    eos_token_id: int | None = token_id(default=2)
    # The decoder starts from <pad> (Marian's convention), so that exports to Marian/CTranslate2 decode alike.
    decoder_start_token_id: int | None = token_id(default=1)

    def __post_init__(self, **kwargs: Any) -> None:
        for symbol, field in PAPER_SYMBOLS.items():
            if symbol in kwargs:
                raise ValueError(
                    f"`{symbol}` is a paper symbol, not a config field (got {symbol}={kwargs[symbol]!r}). "
                    f"Set `{field}`, or use VanillaTransformerConfig.from_paper({symbol}=...)."
                )
        if not type(self).__module__.startswith(f"{TRANSFORMERS_DYNAMIC_MODULE_NAME}."):
            kwargs.pop("custom_pipelines", None)  # the installed package's class: see _PIPELINE
        self.decoder_vocab_size = self.decoder_vocab_size or self.vocab_size
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """The checks across fields (each field's own runs when it is set); each error names the fields, the values
        and the fix. Then transformers' own architecture check."""
        value = self.decoder_vocab_size
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`decoder_vocab_size` must be a positive integer, got {value!r}.")
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{side}_attention_heads` ({heads}) so that "
                    "d_k = d_model / h (§3.2.2) is an integer. Change one of them."
                )
        if self.position_embedding_type == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"`d_model` must be even for sinusoidal positions (§3.5), got {self.d_model}.")
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"`decoder_vocab_size` ({self.decoder_vocab_size}) differs from `vocab_size` ({self.vocab_size}) "
                "but `share_encoder_decoder_embeddings=True` needs one shared vocabulary (§3.4). Set "
                "share_encoder_decoder_embeddings=False for separate vocabularies."
            )
        super().validate_architecture()

    def value_counts(self) -> dict[str, int]:
        """The values (parameters and buffers) a model of this config holds, by part ("embeddings", "encoder",
        "decoder", "position tables"), tied matrices counted once: what loading it allocates, at least."""
        d, vocab, target = self.d_model, self.vocab_size, self.decoder_vocab_size
        embeddings = vocab * d if self.share_encoder_decoder_embeddings else (vocab + target) * d
        embeddings += (0 if self.tie_word_embeddings else target * d) + (target if self.lm_head_bias else 0)
        final_norm = 2 * d if self.add_final_layer_norm else 0
        attention = 4 * (d * d + d)  # the q, k, v and output projections with their biases
        encoder_ffn, decoder_ffn = self.encoder_ffn_dim, self.decoder_ffn_dim
        encoder_layer = attention + 2 * d * encoder_ffn + encoder_ffn + d + 2 * 2 * d  # two LayerNorms
        decoder_layer = 2 * attention + 2 * d * decoder_ffn + decoder_ffn + d + 3 * 2 * d  # three LayerNorms
        learned = self.position_embedding_type == "learned"
        rows = self.max_position_embeddings + (self.position_offset if learned else 0)
        return {
            "embeddings": embeddings,
            "encoder": self.encoder_layers * encoder_layer + final_norm,
            "decoder": self.decoder_layers * decoder_layer + final_norm,
            "position tables": 2 * rows * d,  # the encoder's and the decoder's
        }

    def check_memory(self, available: int = MAX_MODEL_BYTES, where: str = "any one machine holds") -> None:
        """Raise ValueError where a model of this config needs more than `available` bytes (`value_counts`, in the
        config's dtype), naming the field that makes its largest part so large (the one furthest above its
        default) and what `available` is (`where`). Run on every config with the cap `MAX_MODEL_BYTES`; the
        loaders run it again with the machine's memory."""
        value_bytes = _DTYPE_BYTES.get(str(self.dtype).removeprefix("torch."), 4) if self.dtype else 4
        parts = self.value_counts()
        needed = sum(parts.values()) * value_bytes
        if needed <= available:
            return
        part = max(parts, key=parts.__getitem__)
        sizes = {
            "embeddings": ("vocab_size", "decoder_vocab_size", "d_model"),
            "encoder": ("encoder_layers", "d_model", "encoder_ffn_dim"),
            "decoder": ("decoder_layers", "d_model", "decoder_ffn_dim"),
            "position tables": ("max_position_embeddings", "d_model"),
        }[part]
        defaults = {field.name: field.default for field in dataclasses.fields(VanillaTransformerConfig)}
        name = max(sizes, key=lambda field: getattr(self, field) / (defaults[field] or defaults["vocab_size"]))
        raise ValueError(
            f"`{name}={getattr(self, name)}` makes a model of {_bytes(needed)} ({sum(parts.values()):.3g} values, "
            f"the {part} alone {_bytes(parts[part] * value_bytes)}), more than {where} ({_bytes(available)}). Set "
            f"`{name}` to the size the model was built with."
        )

    def validate_memory(self) -> None:
        """A model of this config fits into `MAX_MODEL_BYTES` (`check_memory`)."""
        self.check_memory()

    def validate_token_ids(self) -> None:
        """Special token ids (integers or None, `token_id`) lie inside the vocabulary (transformers' own check only
        warns)."""
        for name in ("bos_token_id", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            limit = self.vocab_size if name in ("bos_token_id",) else self.decoder_vocab_size
            limit = min(self.vocab_size, self.decoder_vocab_size) if name == "pad_token_id" else limit
            if value is not None and not 0 <= value < limit:
                sizes = "`vocab_size`" if name == "bos_token_id" else "`vocab_size` / `decoder_vocab_size`"
                raise ValueError(
                    f"`{name}` must lie inside the vocabulary [0, {limit}) set by {sizes}, got {value}. Use the id "
                    "your tokenizer gives this token, or enlarge the vocabulary."
                )
        super().validate_token_ids()

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """`PretrainedConfig.from_dict`, with validation errors that say they come from a saved config.json."""
        try:
            return super().from_dict(config_dict, **kwargs)
        except (ValueError, TypeError) as error:
            source = kwargs.get("name_or_path") or config_dict.get("_name_or_path") or "a config dict"
            raise ValueError(f"Invalid config.json of {source}: {error} Fix that entry of the file.") from error

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        if "auto_map" in output:
            output["custom_pipelines"] = {task: dict(_PIPELINE) for task in TRANSLATION_TASKS}
        return output

    @classmethod
    def from_paper(
        cls,
        *,
        N: int = 6,  # noqa: N803 - the paper's symbols, on purpose
        d_model: int = 512,
        d_ff: int = 2048,
        h: int = 8,
        P_drop: float = 0.1,  # noqa: N803
        **hf_overrides: Any,
    ) -> "VanillaTransformerConfig":
        """Build a config from the paper's symbols (Table 3); other fields by their Hugging Face names."""
        known = {field.name for field in dataclasses.fields(cls)}
        for key in hf_overrides:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise ValueError(
                    f"`{key}` is not a VanillaTransformerConfig field (got {key}={hf_overrides[key]!r}).{hint}"
                )
        fields: dict[str, Any] = dict(
            encoder_layers=N,
            decoder_layers=N,
            d_model=d_model,
            encoder_ffn_dim=d_ff,
            decoder_ffn_dim=d_ff,
            encoder_attention_heads=h,
            decoder_attention_heads=h,
            dropout=P_drop,
        )
        fields.update(hf_overrides)
        return cls(**fields)

    @classmethod
    def from_preset(cls, name: str, **hf_overrides: Any) -> "VanillaTransformerConfig":
        """A named preset (see `PRESETS`), e.g. `from_preset("transformer-base", vocab_size=37000)`."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}. Choose one of: {', '.join(PRESETS)}.")
        paper = dict(PRESETS[name])
        paper_keys = ("N", "d_model", "d_ff", "h", "P_drop")
        for key in paper_keys:
            if key in hf_overrides:
                paper[key] = hf_overrides.pop(key)
        return cls.from_paper(**paper, **hf_overrides)


def _bytes(count: int) -> str:
    """`count` bytes for a person: 3 significant digits and a binary unit (1.5 GiB, 3.64 TiB, 8.67e+09 EiB)."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(max(count.bit_length() - 1, 0) // 10, len(units) - 1)
    return f"{count / 1024**power:.3g} {units[power]}"


__all__ = ["MAX_MODEL_BYTES", "PRESETS", "VanillaTransformerConfig"]
