"""Each formula of the paper against an independent computation (float64, written from the paper's text)."""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    eager_attention_forward,
    shift_tokens_right,
    sinusoid_table,
)

from ..conftest import random_batch, tiny_model


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_eq1_scaled_dot_product_attention() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, 5, 8)) for _ in range(3))
    mask = np.zeros((2, 1, 5, 5))
    mask[1, :, :, 3:] = -1e9  # masked keys (§3.2.3 "setting to −∞")
    expected = softmax(q @ k.swapaxes(-1, -2) / math.sqrt(8) + mask) @ v  # (B, H, T, Dh)
    module = torch.nn.Module().eval()
    out, weights = eager_attention_forward(
        module, *(torch.tensor(a) for a in (q, k, v, mask)), scaling=1 / math.sqrt(8)
    )
    np.testing.assert_allclose(out.numpy(), expected.transpose(0, 2, 1, 3), atol=1e-12)
    np.testing.assert_allclose(weights[1, :, :, 3:].numpy(), 0.0, atol=1e-12)


def test_multi_head_split_and_merge_by_hand() -> None:
    """§3.2.2 MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""
    model = tiny_model()
    attention = model.model.encoder.layers[0].self_attn
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    attention.double()
    out, _ = attention(x)
    wq, wk, wv, wo = attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj
    heads = []
    for i in range(4):  # h = 4, d_k = 8: head i uses rows i*8:(i+1)*8 of each projection
        rows = slice(8 * i, 8 * (i + 1))
        qi = x @ wq.weight[rows].T + wq.bias[rows]
        ki = x @ wk.weight[rows].T + wk.bias[rows]
        vi = x @ wv.weight[rows].T + wv.bias[rows]
        heads.append(torch.softmax(qi @ ki.transpose(-1, -2) / math.sqrt(8), -1) @ vi)
    expected = torch.cat(heads, -1) @ wo.weight.T + wo.bias
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_causal_mask_hides_the_future() -> None:
    """§3.2.3: a change at target position j leaves the decoder outputs at positions < j unchanged."""
    model = tiny_model()
    batch = random_batch()
    decoder_input_ids = shift_tokens_right(batch["labels"], 1, 1)
    changed = decoder_input_ids.clone()
    changed[:, 3] = 5
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    a = model(**kwargs, decoder_input_ids=decoder_input_ids).logits
    b = model(**kwargs, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :3], b[:, :3], atol=0, rtol=0)
    assert not torch.allclose(a[:, 3:], b[:, 3:])
    eager = tiny_model()
    eager.set_attn_implementation("eager")
    weights = eager(**kwargs, decoder_input_ids=decoder_input_ids, output_attentions=True).decoder_attentions
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    for layer_weights in weights:
        assert torch.all(layer_weights[..., upper] == 0)


def test_eq2_position_wise_ffn_and_post_ln_order() -> None:
    """§3.1 LayerNorm(x + Sublayer(x)) for both sub-layers, with eq. (2) FFN(x) = max(0, x W1 + b1) W2 + b2."""
    model = tiny_model().double()
    layer = model.model.encoder.layers[0]
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    attn, _ = layer.self_attn(x)

    def layer_norm(h: torch.Tensor, module: torch.nn.LayerNorm) -> torch.Tensor:
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as LayerNorm (Ba et al., 2016)
        return (h - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias

    h = layer_norm(x + attn, layer.self_attn_layer_norm)
    ffn = torch.clamp(h @ layer.fc1.weight.T + layer.fc1.bias, min=0) @ layer.fc2.weight.T + layer.fc2.bias
    expected = layer_norm(h + ffn, layer.final_layer_norm)
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)


def test_pre_ln_deviation_order() -> None:
    model = tiny_model(normalize_before=True).double()
    layer = model.model.encoder.layers[0]
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    h = x + layer.self_attn(layer.self_attn_layer_norm(x))[0]
    g = layer.final_layer_norm(h)
    expected = h + layer.fc2(torch.relu(layer.fc1(g)))
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)


def test_annotated_std_layer_norm_deviation() -> None:
    """layer_norm_type="annotated_std": weight * (x - mean) / (std + eps) + bias, std with n - 1 (the Annotated
    Transformer), written out element by element; every LayerNorm of the model, the final ones too."""
    model = tiny_model(layer_norm_type="annotated_std", normalize_before=True, add_final_layer_norm=True).double()
    norms = [module for name, module in model.named_modules() if name.endswith("layer_norm")]
    assert len(norms) == 2 * 2 + 2 * 3 + 2 and all(type(norm).__name__.endswith("StdLayerNorm") for norm in norms)
    norm = model.model.decoder.layer_norm
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 32, dtype=torch.float64)
    for row, output in zip(x.tolist(), norm(x).tolist(), strict=True):
        mean = sum(row) / len(row)
        std = math.sqrt(sum((v - mean) ** 2 for v in row) / (len(row) - 1))
        expected = [
            w * (v - mean) / (std + model.config.layer_norm_eps) + b
            for v, w, b in zip(row, norm.weight.tolist(), norm.bias.tolist(), strict=True)
        ]
        assert max(abs(a - e) for a, e in zip(output, expected, strict=True)) < 1e-12
    with pytest.raises(ValueError, match="layer_norm_type"):
        tiny_model(layer_norm_type="rms")


def closed_form_pe(pos: int, dim: int, layout: str, offset: int = 0) -> list[float]:
    """§3.5 written out element by element; the deviations as their implementations document them."""
    p = pos + offset
    if layout == "interleaved":
        return [
            math.sin(p / 10000 ** (j / dim)) if j % 2 == 0 else math.cos(p / 10000 ** ((j - 1) / dim))
            for j in range(dim)
        ]
    half = dim // 2
    if layout == "concat":  # Marian: [sin(p / 10000^(2i/d)) | cos(p / 10000^(2i/d))]
        return [math.sin(p / 10000 ** (2 * i / dim)) for i in range(half)] + [
            math.cos(p / 10000 ** (2 * i / dim)) for i in range(half)
        ]
    freqs = [math.exp(-k * math.log(10000) / (half - 1)) for k in range(half)]  # fairseq / tensor2tensor
    return [math.sin(p * f) for f in freqs] + [math.cos(p * f) for f in freqs]


@pytest.mark.parametrize("layout", ["interleaved", "concat", "fairseq"])
@pytest.mark.parametrize("offset", [0, 2])
def test_section_3_5_positional_encoding(layout: str, offset: int) -> None:
    table = sinusoid_table(60, 16, layout, offset)
    for pos in (0, 1, 50, 59):
        np.testing.assert_allclose(table[pos].numpy(), closed_form_pe(pos, 16, layout, offset), atol=2e-6)


def test_positions_and_sqrt_d_model_scaling_enter_the_encoder() -> None:
    """§3.4 embeddings × √d_model, §3.5 PE added "at the bottoms of the encoder and decoder stacks"."""
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 7, 8]])
    seen = {}
    model.model.encoder.layers[0].register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0]))
    model.model.encoder(input_ids=input_ids)
    pe = torch.tensor([closed_form_pe(p, 32, "interleaved") for p in range(4)], dtype=torch.float32)
    expected = model.model.shared.weight[input_ids] * math.sqrt(32) + pe
    torch.testing.assert_close(seen["x"], expected, atol=1e-5, rtol=0)


def test_dropout_only_at_the_papers_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    """§5.4: dropout on each sub-layer output and on embeddings + positions; none on attention weights or ReLU."""
    model = tiny_model(dropout=0.1).train()
    calls: list[float] = []

    def recording(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def record(x: torch.Tensor, p: float = 0.5, training: bool = True, *args: Any) -> torch.Tensor:
            if p > 0 and training:
                calls.append(p)
            return original(x, p, training, *args)

        return record

    # torch's dropout: the model's nn.Dropout modules, and the eager attention's on its weights.
    monkeypatch.setattr(torch.nn.functional, "dropout", recording(torch.nn.functional.dropout))
    model.set_attn_implementation("eager")
    model(**random_batch())
    # encoder: embeddings + 2 sub-layers × 2 layers; decoder: embeddings + 3 sub-layers × 2 layers
    assert calls == [0.1] * (1 + 2 * 2 + 1 + 3 * 2)


def test_three_way_tying_is_one_tensor() -> None:
    """§3.4: the same weight matrix for both embedding layers and the pre-softmax linear transformation."""
    model = tiny_model()
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
