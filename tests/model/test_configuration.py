"""VanillaTransformerConfig: paper defaults, factories, serialization and every validation message."""

import json

import pytest
from transformers import AutoConfig

from hf_vanilla_transformer import PRESETS, VanillaTransformerConfig


def test_defaults_are_the_paper_base_model() -> None:
    config = VanillaTransformerConfig()
    assert (config.encoder_layers, config.decoder_layers, config.d_model) == (6, 6, 512)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu" and config.scale_embedding
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert (config.position_embedding_type, config.sinusoidal_layout) == ("sinusoidal", "interleaved")
    assert not config.normalize_before and not config.add_final_layer_norm and not config.lm_head_bias
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.hidden_size == 512 and config.num_attention_heads == 8 and config.num_hidden_layers == 6


def test_from_paper_maps_symbols_to_fields() -> None:
    config = VanillaTransformerConfig.from_paper(N=3, d_model=256, d_ff=1024, h=4, P_drop=0.3, vocab_size=100)
    assert (config.encoder_layers, config.decoder_layers) == (3, 3)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (1024, 1024)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (4, 4)
    assert config.dropout == 0.3 and config.vocab_size == 100 and config.decoder_vocab_size == 100
    with pytest.raises(ValueError, match="`n` is not a VanillaTransformerConfig field"):
        VanillaTransformerConfig.from_paper(n=3)
    with pytest.raises(ValueError, match="Did you mean `d_model`"):
        VanillaTransformerConfig.from_preset("transformer-base", dmodel=3)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build(name: str) -> None:
    config = VanillaTransformerConfig.from_preset(name, vocab_size=1000)
    assert config.d_model == PRESETS[name]["d_model"] and config.encoder_layers == PRESETS[name]["N"]
    assert config.dropout == PRESETS[name]["P_drop"]


def test_big_presets_follow_table_3_and_section_6_1() -> None:
    big = VanillaTransformerConfig.from_preset("transformer-big")
    assert (big.d_model, big.encoder_ffn_dim, big.encoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert VanillaTransformerConfig.from_preset("transformer-big-en-fr").dropout == 0.1


def test_round_trip_and_auto_config(tmp_path) -> None:
    config = VanillaTransformerConfig.from_paper(
        N=2, d_model=64, d_ff=128, h=4, vocab_size=99, sinusoidal_layout="concat"
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VanillaTransformerConfig)
    assert {k: v for k, v in loaded.to_dict().items() if k != "_name_or_path"} == {
        k: v for k, v in config.to_dict().items() if k != "_name_or_path"
    }
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vanilla_transformer"


ERRORS = [
    (dict(N=3), "`N` is a paper symbol"),
    (dict(h=4), "`h` is a paper symbol"),
    (dict(d_ff=4), "`d_ff` is a paper symbol"),
    (dict(P_drop=0.3), "`P_drop` is a paper symbol"),
    (dict(d_k=8), "`d_k` is a paper symbol"),
    (dict(d_model=100), "`d_model` (100) must be divisible by `encoder_attention_heads` (8)"),
    (dict(decoder_attention_heads=7), "`d_model` (512) must be divisible by `decoder_attention_heads` (7)"),
    (dict(dropout=1.0), "`dropout` must be a probability in [0, 1), got 1.0. The paper uses 0.1 (§5.4)"),
    (
        dict(attention_dropout=-0.1),
        "`attention_dropout` must be a probability in [0, 1), got -0.1. The paper has none",
    ),
    (dict(activation_dropout="0.1"), "`activation_dropout` must be a probability in [0, 1), got '0.1'"),
    (dict(vocab_size=0), "`vocab_size` must be a positive integer, got 0"),
    (dict(encoder_layers=2.5), "`encoder_layers` must be a positive integer, got 2.5"),
    (dict(d_model=True), "`d_model` must be a positive integer, got True"),
    (dict(scale_embedding="yes"), "`scale_embedding` must be True or False, got 'yes'"),
    (dict(position_embedding_type="rotary"), "`position_embedding_type` must be one of ('sinusoidal', 'learned')"),
    (dict(sinusoidal_layout="t2t"), "`sinusoidal_layout` must be one of ('interleaved', 'concat', 'fairseq')"),
    (dict(activation_function="tanh"), "`activation_function` must be one of"),
    (dict(position_offset=-1), "`position_offset` must be a non-negative integer, got -1"),
    (dict(layer_norm_eps=0), "`layer_norm_eps` must be a positive number, got 0"),
    (dict(init_std=-1.0), "`init_std` must be a positive number, got -1.0"),
    (dict(decoder_vocab_size=10), "`decoder_vocab_size` (10) differs from `vocab_size` (37000)"),
    (
        dict(pad_token_id=37000),
        "`pad_token_id` must lie inside the vocabulary [0, 37000) set by `vocab_size` / `decoder_vocab_size`, "
        "got 37000",
    ),
    (dict(eos_token_id="2"), "`eos_token_id` must be an integer token id or None, got '2'"),
    (
        dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=10, decoder_start_token_id=12),
        "`decoder_start_token_id` must lie inside the vocabulary [0, 10) set by `vocab_size` / "
        "`decoder_vocab_size`, got 12",
    ),
    (dict(d_model=9, encoder_attention_heads=1, decoder_attention_heads=1), "`d_model` must be even for sinusoidal"),
]


@pytest.mark.parametrize(
    ("kwargs", "message"), ERRORS, ids=[next(iter(k)) + "-" + str(i) for i, (k, _) in enumerate(ERRORS)]
)
def test_every_config_error_names_field_value_and_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        VanillaTransformerConfig(**kwargs)
    assert message in str(error.value)


def test_unknown_preset_lists_choices() -> None:
    with pytest.raises(ValueError, match=r"Unknown preset 'transformer-huge'\. Choose one of: transformer-base"):
        VanillaTransformerConfig.from_preset("transformer-huge")


def test_separate_vocabularies_are_allowed_when_not_shared() -> None:
    config = VanillaTransformerConfig(share_encoder_decoder_embeddings=False, vocab_size=100, decoder_vocab_size=50)
    assert (config.vocab_size, config.decoder_vocab_size) == (100, 50)


def test_transformers_own_validators_run_beside_ours(tmp_path) -> None:
    """`validate` runs every `validate_*` hook of transformers' `@strict` mechanism, not only this config's checks:
    transformers' `validate_output_attentions` refuses attention weights from a backend that cannot return them,
    at construction and again when a changed config is saved."""
    with pytest.raises(ValueError, match=r"`output_attentions` attribute is not supported .* sdpa"):
        VanillaTransformerConfig(output_attentions=True, attn_implementation="sdpa")
    config = VanillaTransformerConfig(output_attentions=True, attn_implementation="eager")
    config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="`output_attentions` attribute is not supported"):
        config.save_pretrained(tmp_path)
    # Our own hooks extend transformers' of the same name; their messages come first.
    with pytest.raises(ValueError, match=r"`d_model` \(100\) must be divisible by `encoder_attention_heads` \(8\)"):
        VanillaTransformerConfig(d_model=100)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=50),
        dict(tie_word_embeddings=False, lm_head_bias=True),
        dict(position_embedding_type="learned", position_offset=2),
        dict(add_final_layer_norm=True, normalize_before=True, layer_norm_type="annotated_std"),
        dict(encoder_layers=1, decoder_layers=3, encoder_ffn_dim=48),
    ],
)
def test_value_counts_are_the_models_parameters_and_buffers(overrides: dict) -> None:
    from ..conftest import tiny_model

    model = tiny_model(**overrides)
    held = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())  # tied: once
    assert sum(model.config.value_counts().values()) == held


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(d_model=10**9), "`d_model=1000000000` makes a model of 250 EiB (7.2e+19 values, the decoder alone"),
        (dict(max_position_embeddings=10**12), "`max_position_embeddings=1000000000000` makes a model of 3.64 PiB"),
        (dict(vocab_size=10**12), "`vocab_size=1000000000000` makes a model of 1.82 PiB"),
        (dict(encoder_layers=10**8), "`encoder_layers=100000000` makes a model of 1.12 PiB"),
    ],
)
def test_a_config_no_machine_can_hold_is_refused_naming_the_field(overrides: dict, message: str) -> None:
    """Values that ask terabytes or more are refused when the config is made, naming the field, the memory and the
    cap, rather than by the allocator when the model is built (a RuntimeError traceback)."""
    with pytest.raises(ValueError) as error:
        VanillaTransformerConfig(**overrides)
    assert message in str(error.value) and "more than any one machine holds (64 TiB)" in str(error.value)
    assert f"Set `{next(iter(overrides))}` to the size the model was built with." in str(error.value)
    # The largest paper model stays far below the cap, and a config just under it is accepted.
    VanillaTransformerConfig.from_preset("transformer-big", vocab_size=10**6)
    VanillaTransformerConfig(max_position_embeddings=2**46 // (4 * 2 * 512) - 10**8)


def test_a_field_set_after_construction_is_checked_with_the_same_error() -> None:
    """`@strict`: a field's own check runs on every assignment, not only at construction, and says the same thing;
    the config keeps its value."""
    config = VanillaTransformerConfig()
    for name, value, message in [
        ("d_model", 0, "`d_model` must be a positive integer, got 0."),
        ("dropout", 1.5, "`dropout` must be a probability in [0, 1), got 1.5. The paper uses 0.1 (§5.4)."),
        ("sinusoidal_layout", "t2t", "`sinusoidal_layout` must be one of ('interleaved', 'concat', 'fairseq')"),
        ("eos_token_id", "2", "`eos_token_id` must be an integer token id or None, got '2'."),
    ]:
        before = getattr(config, name)
        with pytest.raises(ValueError) as error:
            setattr(config, name, value)
        assert message in str(error.value) and getattr(config, name) == before
