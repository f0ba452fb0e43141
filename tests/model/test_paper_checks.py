"""The paper's model against its own text, written out independently in float64: §3.5's relative-position property,
a decoder layer's sub-layers in Figure 1's order, the whole forward pass, and Table 3's parameter counts."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.modeling_vanilla_transformer import shift_tokens_right, sinusoid_table

from ..conftest import random_batch, tiny_model

D_MODEL, HEADS = 32, 4  # tiny_model's width and heads


def rotation(k: int, dim: int) -> np.ndarray:
    """R_k of §3.5: a 2×2 rotation by k·ω_i on each (sin, cos) pair, ω_i = 1 / 10000^(2i/d_model); no pos in it."""
    omega = 1 / 10000 ** (np.arange(0, dim, 2) / dim)
    c, s = np.cos(k * omega), np.sin(k * omega)
    r_k = np.zeros((dim, dim))
    r_k[0::2, 0::2], r_k[0::2, 1::2] = np.diag(c), np.diag(s)
    r_k[1::2, 0::2], r_k[1::2, 1::2] = np.diag(-s), np.diag(c)
    return r_k


@pytest.mark.parametrize("k", [1, 7, 100])
def test_positional_encoding_of_pos_plus_k_is_one_rotation_of_pos(k: int) -> None:
    """§3.5: "for any fixed offset k, PE_pos+k can be represented as a linear function of PE_pos": the same R_k for
    every position of the library's table."""
    dim, positions = 64, 300
    table = sinusoid_table(positions + k, dim).double().numpy()
    np.testing.assert_allclose(table[k:], table[:-k] @ rotation(k, dim).T, atol=2e-5, rtol=0)


def test_the_rotation_property_fails_for_the_wrong_cosine_exponent() -> None:
    """The check can fail: a table whose cosines use 10000^((2i+1)/d_model), a slip of lecture notes, breaks it."""
    dim = 64
    positions = np.arange(120)[:, None]
    i = np.arange(dim // 2)[None, :]
    wrong = np.zeros((120, dim))
    wrong[:, 0::2] = np.sin(positions / 10000 ** (2 * i / dim))
    wrong[:, 1::2] = np.cos(positions / 10000 ** ((2 * i + 1) / dim))
    assert np.abs(wrong[5:] - wrong[:-5] @ rotation(5, dim).T).max() > 0.1


# ---------------------------------------------------------------------------------------- the layers written out


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """Ba et al. (2016): per token, over its features, with the biased variance; then gain and bias."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def multi_head(
    queries: torch.Tensor, keys_values: torch.Tensor, module: nn.Module, keep: torch.Tensor
) -> torch.Tensor:
    """§3.2.2 with eq. (1) for one sequence: (T, D) queries, (L, D) keys/values, keep (T, L) True where attended."""
    d_k = D_MODEL // HEADS

    def split(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:  # (L, D) -> (H, L, d_k)
        return (x @ linear.weight.T + linear.bias).view(len(x), HEADS, d_k).transpose(0, 1)

    scores = split(queries, module.q_proj) @ split(keys_values, module.k_proj).transpose(1, 2) / math.sqrt(d_k)
    weights = torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
    heads = weights @ split(keys_values, module.v_proj)  # (H, T, d_v)
    return heads.transpose(0, 1).reshape(len(queries), -1) @ module.out_proj.weight.T + module.out_proj.bias


def ffn(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """Eq. (2): max(0, x W1 + b1) W2 + b2."""
    return torch.clamp(x @ layer.fc1.weight.T + layer.fc1.bias, min=0) @ layer.fc2.weight.T + layer.fc2.bias


def decoder_layer(y: torch.Tensor, memory: torch.Tensor, layer: nn.Module, memory_keep: torch.Tensor) -> torch.Tensor:
    """Figure 1 (right), §3.1: masked self-attention, encoder-decoder attention, FFN; each LayerNorm(x + Sublayer)."""
    causal = torch.ones(len(y), len(y), dtype=torch.bool).tril()  # position i attends to j ≤ i
    y = layer_norm(y + multi_head(y, y, layer.self_attn, causal), layer.self_attn_layer_norm)
    y = layer_norm(y + multi_head(y, memory, layer.encoder_attn, memory_keep), layer.encoder_attn_layer_norm)
    return layer_norm(y + ffn(y, layer), layer.final_layer_norm)


def test_decoder_layer_sub_layers_in_the_papers_order_float64() -> None:
    model = tiny_model().double()
    model.set_attn_implementation("eager")
    layer = model.model.decoder.layers[1]
    generator = torch.Generator().manual_seed(0)
    y = torch.randn(6, D_MODEL, dtype=torch.float64, generator=generator)
    memory = torch.randn(9, D_MODEL, dtype=torch.float64, generator=generator)
    memory_keep = torch.arange(9) < 7  # the last two source positions are padding
    causal = torch.zeros(6, 6, dtype=torch.float64).masked_fill(torch.ones(6, 6).triu(1).bool(), -math.inf)
    padding = torch.zeros(1, 9, dtype=torch.float64).masked_fill(~memory_keep, -math.inf)
    with torch.no_grad():
        output = layer(y[None], causal[None, None], memory[None], encoder_attention_mask=padding[None, None])[0]
        expected = decoder_layer(y, memory, layer, memory_keep[None, :])
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)


def test_whole_forward_written_from_the_paper_equals_model_double() -> None:
    """Embeddings × √d_model + PE (§3.4, §3.5), N post-LN encoder and decoder layers, the tied output projection,
    on a right-padded batch: the logits of `model.double()` to float64 rounding."""
    model = tiny_model().double()
    batch = random_batch()
    decoder_input_ids = shift_tokens_right(batch["labels"], 1, 1)
    embeddings = model.model.shared.weight
    positions = np.arange(64)[:, None] / 10000 ** (np.arange(0, D_MODEL, 2)[None, :] / D_MODEL)
    pe = np.zeros((64, D_MODEL))
    pe[:, 0::2], pe[:, 1::2] = np.sin(positions), np.cos(positions)
    pe = torch.tensor(pe).float().double()  # the model keeps §3.5's table in float32
    expected = []
    with torch.no_grad():
        for ids, keep, target in zip(
            batch["input_ids"], batch["attention_mask"].bool(), decoder_input_ids, strict=True
        ):
            x = embeddings[ids] * math.sqrt(D_MODEL) + pe[: len(ids)]
            for layer in model.model.encoder.layers:
                x = layer_norm(x + multi_head(x, x, layer.self_attn, keep[None, :]), layer.self_attn_layer_norm)
                x = layer_norm(x + ffn(x, layer), layer.final_layer_norm)
            y = embeddings[target] * math.sqrt(D_MODEL) + pe[: len(target)]
            for layer in model.model.decoder.layers:
                y = decoder_layer(y, x, layer, keep[None, :])
            expected.append(y @ embeddings.T)  # the pre-softmax linear transformation is the embedding matrix
        logits = model(**batch, decoder_input_ids=decoder_input_ids).logits
    assert batch["attention_mask"].eq(0).any(), "the batch must hold padding"
    torch.testing.assert_close(logits, torch.stack(expected), atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------------------------------- Table 3


@pytest.mark.parametrize(
    ("preset", "n_layers", "d_model", "d_ff", "paper"),
    [("transformer-base", 6, 512, 2048, 65e6), ("transformer-big", 6, 1024, 4096, 213e6)],
)
def test_table_3_parameter_counts_on_the_meta_device(
    preset: str, n_layers: int, d_model: int, d_ff: int, paper: float
) -> None:
    """The model built on the meta device (no memory) with the paper's shared vocabulary of about 37000 tokens has the
    parameters §3 describes, tied matrices once; that is Table 3's figure to within 3% (the paper rounds and does not
    give its exact vocabulary: base 63.1M against its 65M, big 214.2M against its 213M)."""
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig.from_preset(preset, vocab_size=37000)
        )
    attention = 4 * (d_model * d_model + d_model)  # W^Q, W^K, W^V, W^O with biases
    ffn_size = (d_model * d_ff + d_ff) + (d_ff * d_model + d_model)
    norm = 2 * d_model
    by_hand = (
        37000 * d_model
        + n_layers * (attention + ffn_size + 2 * norm)
        + n_layers * (2 * attention + ffn_size + 3 * norm)
    )
    total = sum(parameter.numel() for parameter in model.parameters())
    assert total == by_hand
    assert abs(total - paper) / paper < 0.03
