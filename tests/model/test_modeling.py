"""Model behaviour: caching, padding, backends, saving, tying variants, loss, outputs, checkpointing, input errors."""

import copy
import json
import math
import pickle

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModel, AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel
from hf_vanilla_transformer.inference import cpu_inference
from hf_vanilla_transformer.inference.cpu_inference import PackedLinear, prepare_for_cpu_inference
from hf_vanilla_transformer.model.label_smoothed_loss import linear_label_smoothed_cross_entropy
from hf_vanilla_transformer.model.modeling_vanilla_transformer import cache_argument, sinusoid_table

from ..conftest import CODE_FILES, VOCAB, random_batch, tiny_model, tiny_tokenizer


@pytest.mark.parametrize("num_beams", [1, 4])
def test_cached_and_uncached_generation_give_the_same_tokens(num_beams: int) -> None:
    model = tiny_model(seed=1)
    batch = random_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12)
    kwargs |= dict(num_beams=num_beams, do_sample=False, eos_token_id=None if num_beams == 1 else 2)
    cached = model.generate(**kwargs, use_cache=True)
    uncached = model.generate(**kwargs, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape[1] > 1


def assert_step_by_step_equals_full_forward(
    model: VanillaTransformerForConditionalGeneration, batch: dict, cache_name: str, cache: object = None
) -> object:
    """Decode the labels' decoder inputs one position per call, without a decoder mask (as a user's own loop would),
    passing the cache under `cache_name`; the logits must equal one full forward pass. Returns the final cache."""
    full = model(**batch).logits
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    steps = []
    for t in range(decoder_input_ids.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            use_cache=True,
            **{cache_name: cache},
        )
        cache = out.past_key_values
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    return cache


@pytest.mark.parametrize(
    "cache_name", ["past_key_values", "cache"]
)  # generate()'s name up to / from transformers 5.24
def test_incremental_decoding_matches_full_forward(cache_name: str) -> None:
    model = tiny_model()
    batch = random_batch()
    assert_step_by_step_equals_full_forward(model, batch, cache_name)


def test_a_cache_under_both_names_is_the_filled_one() -> None:
    """A cache under both names (PEFT's prefix tuning passes its prompt as `past_key_values` beside generate()'s own
    `cache`): a filled `cache` is the cache; an empty one gives way to the other; one name alone is that cache."""
    filled = assert_step_by_step_equals_full_forward(tiny_model(), random_batch(), "cache")
    empty = EncoderDecoderCache(DynamicCache(), DynamicCache())
    assert cache_argument(filled, {"cache": empty}) is filled
    assert cache_argument(empty, {"cache": filled}) is filled
    assert cache_argument(None, {"cache": filled}) is filled and cache_argument(filled, {}) is filled


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


def plain_linear(layer: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """What `nn.Linear.forward` computes, whatever class the layer has now."""
    return torch.nn.functional.linear(hidden, layer.weight, layer.bias)


def linear_classes(model: torch.nn.Module) -> set[type]:
    return {type(module) for module in model.modules() if isinstance(module, torch.nn.Linear)}


def test_a_loaded_model_is_plain_until_prepared(tmp_path) -> None:
    """A model, built or loaded, holds plain `nn.Linear` layers; `prepare_for_cpu_inference` turns them in place
    into `PackedLinear` layers with the same Parameters (tying, state_dict keys and the saved folder unchanged)."""
    model = tiny_model()
    model.save_pretrained(tmp_path / "plain")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "plain")
    assert linear_classes(model) == linear_classes(loaded) == {torch.nn.Linear}
    parameters = dict(model.named_parameters())
    keys = list(model.state_dict())
    assert prepare_for_cpu_inference(model) is model
    assert linear_classes(model) == {PackedLinear}
    assert dict(model.named_parameters()) == parameters and list(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.shared.weight  # still tied
    model.save_pretrained(tmp_path / "prepared")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "prepared" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_prepared_dropout_is_the_identity_in_eval_and_training_brings_back_nn_dropout() -> None:
    """`prepare_for_cpu_inference` turns each `nn.Dropout` into an `InferenceDropout`: the same eval outputs, the
    same state_dict; `model.train()` turns them back into plain `nn.Dropout`, which drops again."""
    model = tiny_model(seed=1, dropout=0.3).eval()
    batch = random_batch()
    with torch.no_grad():
        plain = model(**batch).logits
        prepare_for_cpu_inference(model)
        dropouts = [module for module in model.modules() if isinstance(module, torch.nn.Dropout)]
        assert dropouts and {type(module) for module in dropouts} == {cpu_inference.InferenceDropout}
        assert torch.equal(model(**batch).logits, plain)
        model.train()
        assert {type(module) for module in dropouts} == {torch.nn.Dropout}
        assert not torch.equal(model(**batch).logits, plain)  # P_drop 0.3 drops again
        hidden = torch.ones(10_000)
        kept = dropouts[0](hidden).ne(0).float().mean().item()
        assert abs(kept - 0.7) < 0.02


def test_the_registered_translation_pipeline_prepares_a_cpu_model_in_eval_mode() -> None:
    """`pipeline("translation")` with this package imported prepares our model on the CPU, as `translate` does, and
    translates as the plain model; a model in training mode (the tiny model has no dropout) is left as it is."""
    from transformers import pipeline

    sentences = ["w5 w6 w7 w8", "w9 w10"]
    model = tiny_model(seed=3)
    translator = pipeline("translation", model=model, tokenizer=tiny_tokenizer())
    assert translator.model is model and linear_classes(model) == {PackedLinear}
    training = tiny_model(seed=3).train()
    reference = pipeline("translation", model=training, tokenizer=tiny_tokenizer())
    assert linear_classes(training) == {torch.nn.Linear}
    assert translator(sentences, max_new_tokens=5) == reference(sentences, max_new_tokens=5)


@needs_onednn
def test_prepared_linear_uses_a_packed_weight_equal_to_the_linear(monkeypatch) -> None:
    """The model's layers, called as the model calls them (`self.lm_head(hidden)`), take the packed path where it
    pays, and follow every change of the weight that bumps its version counter or replaces its storage."""
    model = prepare_for_cpu_inference(tiny_model())
    lm_head = model.lm_head
    hidden = torch.randn(3, 5, 32)
    with torch.no_grad():
        # A float32 product below the size threshold takes the plain linear; the tiny model's are all below it.
        assert hidden.numel() * lm_head.out_features < cpu_inference.PACKED_LINEAR_MIN_MACS
        assert torch.equal(lm_head(hidden), plain_linear(lm_head, hidden))
        assert lm_head.packed == {}
        monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", hidden.numel() * lm_head.out_features)
        packed = lm_head(hidden)
        assert set(lm_head.packed) == {torch.float32}
        torch.testing.assert_close(packed, plain_linear(lm_head, hidden), atol=1e-5, rtol=1e-5)
        # A change to the weight in place (load_state_dict, an optimizer's foreach step) is seen: no stale copy.
        lm_head.weight.mul_(-2.0)
        torch.testing.assert_close(lm_head(hidden), plain_linear(lm_head, hidden), atol=1e-5, rtol=1e-5)
        # So is new storage (`model.to(...)` sets `.data`).
        lm_head.weight.data = lm_head.weight.data * 0.5
        torch.testing.assert_close(lm_head(hidden), plain_linear(lm_head, hidden), atol=1e-5, rtol=1e-5)
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(lm_head(hidden), plain_linear(lm_head, hidden))
    # Gradients wanted take the plain linear (gradients flow to the tied embedding).
    hidden.requires_grad_(True)
    logits = lm_head(hidden)
    assert torch.equal(logits, plain_linear(lm_head, hidden))
    logits.sum().backward()
    assert model.model.shared.weight.grad is not None and hidden.grad is not None
    # A weight made under inference mode (no version counter to watch) takes the plain linear.
    with torch.inference_mode():
        made_there = prepare_for_cpu_inference(tiny_model())
        assert torch.equal(made_there.lm_head(hidden), plain_linear(made_there.lm_head, hidden))
        assert made_there.lm_head.packed == {}


@needs_onednn
def test_preparing_again_repacks_from_the_current_weights(monkeypatch) -> None:
    """A write through `.data` bumps no version counter and keeps the storage: the packed copy is stale until
    `prepare_for_cpu_inference` is called again (the documented requirement), which always packs anew."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    model = prepare_for_cpu_inference(tiny_model())
    layer = model.model.decoder.layers[0].fc1
    hidden = torch.randn(2, 3, 32)
    with torch.no_grad():
        before = layer(hidden)
        layer.weight.data.mul_(0.5)
        assert torch.equal(layer(hidden), before)  # stale: why the docstring asks for a new call
        prepare_for_cpu_inference(model)
        assert layer.packed == {}
        torch.testing.assert_close(layer(hidden), plain_linear(layer, hidden), atol=1e-5, rtol=1e-5)
        assert set(layer.packed) == {torch.float32}


@needs_onednn
def test_training_undoes_the_preparation(monkeypatch) -> None:
    """`model.train()` turns every `PackedLinear` back into a plain `nn.Linear` without copies; `model.eval()` does
    not pack again, only a new `prepare_for_cpu_inference` does; preparing a model in training mode is refused."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    model = prepare_for_cpu_inference(tiny_model())
    batch = random_batch()
    model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3)
    assert model.lm_head.packed
    model.train()
    assert linear_classes(model) == {torch.nn.Linear}
    assert not any("packed" in module.__dict__ for module in model.modules())
    with pytest.raises(ValueError, match=r"model.training is True .*call model.eval\(\) first"):
        prepare_for_cpu_inference(model)
    model.eval()
    assert linear_classes(model) == {torch.nn.Linear}
    prepare_for_cpu_inference(model)
    assert linear_classes(model) == {PackedLinear}


@needs_onednn
@pytest.mark.parametrize("kind", ["fused", "foreach", "for-loop"])
def test_evaluation_between_optimizer_steps_multiplies_by_the_new_weights(kind: str, monkeypatch) -> None:
    """Training steps between evaluations, as the Trainer runs them (`model.train()` before each step, `model.eval()`
    and the step before each evaluation): the evaluation multiplies by the stepped weights, also after a fused Adam
    step (transformers' default `adamw_torch_fused`), which bumps no version counter."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    layer = torch.nn.Linear(32, 64)
    options = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[kind]
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, **options)
    hidden = torch.randn(4, 32)
    for _ in range(2):
        prepare_for_cpu_inference(layer.eval())
        with torch.no_grad():
            torch.testing.assert_close(layer(hidden), plain_linear(layer, hidden), atol=1e-5, rtol=1e-5)
            assert set(layer.packed) == {torch.float32}
        layer.train()
        layer(hidden).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    prepare_for_cpu_inference(layer.eval())
    with torch.no_grad():
        torch.testing.assert_close(layer(hidden), plain_linear(layer, hidden), atol=1e-5, rtol=1e-5)


@pytest.fixture
def two_threads():
    """torch at 2 threads for the test (CI's core count), whatever this machine has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@needs_onednn
def test_a_few_rows_are_not_split_where_the_split_does_not_pay(two_threads, monkeypatch) -> None:
    """On a CPU where the split does not pay (`few_row_split_pays`: an Intel CPU's rule), a one-row product of a
    prepared layer is `F.linear` itself; the rule reads the CPU's vendor."""
    splits = []
    rule = cpu_inference.few_row_split_pays
    monkeypatch.setattr(cpu_inference, "split_linear", lambda *args: splits.append(args[3]))
    monkeypatch.setattr(cpu_inference, "few_row_split_pays", lambda: False)
    layer = prepare_for_cpu_inference(tiny_model()).model.decoder.layers[0].fc1
    hidden = torch.randn(1, 1, 32)
    with torch.no_grad():
        assert torch.equal(layer(hidden), plain_linear(layer, hidden))
    assert splits == []
    vendor = next((line for line in open("/proc/cpuinfo", encoding="utf-8") if line.startswith("vendor_id")), "")
    assert rule.__wrapped__() == ("AuthenticAMD" in vendor)


@needs_onednn
def test_a_few_rows_are_split_over_the_threads_and_equal_the_linear(two_threads, monkeypatch) -> None:
    """A decoding step's small float32 products (at most SPLIT_LINEAR_MAX_ROWS rows) run as one batched product over
    blocks of output rows, equal to `F.linear` up to float32 rounding; more rows, gradients, hooks, oneDNN off and
    unprepared layers take `F.linear` itself (equal bit for bit)."""
    splits = []
    split_linear = cpu_inference.split_linear
    monkeypatch.setattr(cpu_inference, "split_linear", lambda *args: splits.append(args[3]) or split_linear(*args))
    monkeypatch.setattr(cpu_inference, "few_row_split_pays", lambda: True)  # the rule of an AMD CPU, on any host
    model = prepare_for_cpu_inference(tiny_model())
    layer = model.model.decoder.layers[0].fc1  # 32 -> 64, with a bias
    for rows, expect_split in ((1, True), (cpu_inference.SPLIT_LINEAR_MAX_ROWS, True), (5, False)):
        hidden = torch.randn(rows, 1, 32)
        splits.clear()
        with torch.no_grad():
            got = layer(hidden)
        assert splits == ([2] if expect_split else [])
        if expect_split:
            torch.testing.assert_close(got, plain_linear(layer, hidden), atol=1e-6, rtol=1e-6)
        else:
            assert torch.equal(got, plain_linear(layer, hidden))
    # A layer without a bias is split too; 1 thread, or an odd number of outputs (the tiny model's output
    # projection: 61), leaves nothing to split.
    hidden = torch.randn(1, 1, 32)
    with torch.no_grad():
        unbiased = prepare_for_cpu_inference(torch.nn.Linear(32, 64, bias=False).eval())
        torch.testing.assert_close(unbiased(hidden), plain_linear(unbiased, hidden), atol=1e-6, rtol=1e-6)
        assert splits == [2]
        splits.clear()
        assert torch.equal(model.lm_head(hidden), plain_linear(model.lm_head, hidden))
        torch.set_num_threads(1)
        assert torch.equal(layer(hidden), plain_linear(layer, hidden))
        torch.set_num_threads(2)
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layer(hidden), plain_linear(layer, hidden))
        handle = layer.register_forward_hook(lambda module, args, output: output)
        assert torch.equal(layer(hidden), plain_linear(layer, hidden))
        handle.remove()
    assert torch.equal(layer(hidden.requires_grad_(True)), plain_linear(layer, hidden))  # gradients: F.linear
    assert splits == []
    # Batch-1 generation (greedy and beam 4, whose steps have 1 and 4 rows) gives the tokens of the plain model.
    plain_model = tiny_model()
    batch = random_batch(batch=1)
    for beams in (1, 4):
        kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=10)
        kwargs |= dict(num_beams=beams, do_sample=False, output_scores=True, return_dict_in_generate=True)
        split = model.generate(**kwargs)
        assert splits, "no product was split during generation"
        splits.clear()
        plain = plain_model.generate(**kwargs)
        assert splits == []  # the unprepared model never splits
        assert torch.equal(split.sequences, plain.sequences)
        torch.testing.assert_close(torch.stack(split.scores), torch.stack(plain.scores), atol=1e-4, rtol=1e-5)


@needs_onednn
def test_prepared_models_can_be_deep_copied_and_pickled(monkeypatch) -> None:
    """Packed oneDNN tensors are opaque (no storage): a copy or a pickle of a prepared model leaves them out, and the
    copy, still prepared, packs its own weights on first use."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    model = prepare_for_cpu_inference(tiny_model())
    batch = random_batch()
    with torch.no_grad():
        expected = model(**batch).logits
    assert model.lm_head.packed
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert linear_classes(copied) == {PackedLinear}
        assert all(module.packed == {} for module in copied.modules() if isinstance(module, PackedLinear))
        assert copied.lm_head.weight is copied.model.shared.weight
        with torch.no_grad():
            torch.testing.assert_close(copied(**batch).logits, expected)
        assert set(copied.lm_head.packed) == {torch.float32}
    assert model.lm_head.packed  # the original keeps its own


@needs_onednn
def test_prepared_linear_leaves_wrapped_and_hooked_layers_to_their_own_forward(monkeypatch) -> None:
    """Hooks (offloading, output recorders), another per-instance forward (accelerate's offloading), subclasses
    (quantized layers) and layers inside an adapter wrapper (PEFT's `base_layer`) run as called, around the plain
    linear: the result shows that their code ran, and no packed copy was made."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    layer = prepare_for_cpu_inference(tiny_model()).model.decoder.layers[0].fc1
    hidden = torch.randn(2, 3, 32)
    with torch.no_grad():
        plain = plain_linear(layer, hidden)
        handle = layer.register_forward_hook(lambda module, args, output: output + 1.0)
        assert torch.equal(layer(hidden), plain + 1.0)
        handle.remove()
        handle = layer.register_forward_pre_hook(lambda module, args: (args[0] * 2.0,))
        assert torch.equal(layer(hidden), plain_linear(layer, 2.0 * hidden))
        handle.remove()
        handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: output * 0.0)
        try:
            assert not layer(hidden).any()
        finally:
            handle.remove()
        assert layer.packed == {}  # the hooked layer never took the packed path
        # An offloading wrapper (as accelerate's) keeps the layer's forward and calls it: the plain linear runs.
        installed = layer.forward
        layer.forward = lambda x: installed(x) - 1.0
        assert torch.equal(layer(hidden), plain - 1.0)
        del layer.forward
        assert layer.packed == {}

        class Doubled(torch.nn.Linear):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return 2.0 * super().forward(x)

        class Adapter(torch.nn.Module):  # PEFT's tuner layers: the wrapped layer as `base_layer`
            def __init__(self, base_layer: torch.nn.Linear) -> None:
                super().__init__()
                self.base_layer = base_layer

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.base_layer(x)

        doubled = Doubled(32, 64).eval()
        doubled.load_state_dict(layer.state_dict())
        prepare_for_cpu_inference(doubled)
        assert type(doubled) is Doubled and torch.equal(doubled(hidden), 2.0 * plain)
        adapter = prepare_for_cpu_inference(Adapter(layer).eval())  # wrapped after an earlier step: undone
        assert type(layer) is torch.nn.Linear and torch.equal(adapter(hidden), plain)
        # Unwrapped and without hooks, the same layer is packed again.
        prepare_for_cpu_inference(layer)
        torch.testing.assert_close(layer(hidden), plain, atol=1e-5, rtol=1e-5)
        assert set(layer.packed) == {torch.float32}


@needs_onednn
def test_traced_and_exported_graphs_hold_the_plain_linear(monkeypatch) -> None:
    """torch.jit.trace and torch.export record portable ops (for ONNX and other runtimes), not oneDNN's packed one."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)

    class Projection(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = tiny_model().model.decoder.layers[0].fc1

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.fc1(hidden)

    module, hidden = prepare_for_cpu_inference(Projection().eval()), torch.randn(2, 3, 32)
    assert type(module.fc1) is PackedLinear
    with torch.no_grad():
        traced = torch.jit.trace(module, hidden)
        exported = torch.export.export(module, (hidden,))
        for graph in (str(traced.inlined_graph), str(exported.graph)):
            assert "linear" in graph and "mkldnn" not in graph
        torch.testing.assert_close(exported.module()(hidden), plain_linear(module.fc1, hidden))


@needs_onednn
def test_compiled_forward_is_one_graph_on_the_cpu(monkeypatch) -> None:
    """torch.compile(fullgraph=True) of a prepared model's forward in eval mode, every layer past the packing
    threshold: the packed path's checks stay out of the graph (transformers'
    test_generate_compile_model_forward_fullgraph), and the result is the eager one."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    model = prepare_for_cpu_inference(tiny_model())
    batch = random_batch()
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        eager = model(**inputs).logits
    assert model.lm_head.packed, "the eager forward did not take the packed path"
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # tracing is what may break; no C++ build
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, eager, atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bf16 kernels on this CPU")
def test_prepared_linear_under_bf16_autocast_matches_autocast_linear() -> None:
    """Under bf16 autocast the packed path keeps a bf16 packed weight and the bias cast to bf16, the bias following
    its in-place changes (a bias-only step, BitFit's)."""
    layer = prepare_for_cpu_inference(tiny_model()).model.encoder.layers[0].fc2
    hidden = torch.randn(4, 7, 64)
    for _ in range(2):
        # A new autocast block each time: autocast keeps its own casts of the weights for the block.
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            expected = plain_linear(layer, hidden)
            got = layer(hidden)
        assert set(layer.packed) == {torch.bfloat16}  # a bf16 copy: the fp32 one is not made
        assert got.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected)  # bf16 tolerances: the same products, rounded to bf16
        with torch.no_grad():
            layer.bias.add_(1.0)
    # bf16 weights without autocast take the same path; a float32 input then stays an error, as for the linear.
    layer.bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(layer(hidden.bfloat16()), plain_linear(layer, hidden.bfloat16()))
        with pytest.raises(RuntimeError):
            layer(hidden)


@needs_onednn
def test_generation_packs_every_linear_and_matches_the_plain_model(monkeypatch) -> None:
    """Every projection of a decoding step (attention, FFN, output) of a prepared model runs packed during
    `generate` on the CPU (the size threshold lowered for the tiny model), and the scores equal those of the
    unprepared model up to float32 rounding."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    model = prepare_for_cpu_inference(tiny_model(seed=2))
    batch = random_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8)
    kwargs |= dict(num_beams=2, do_sample=False, output_scores=True, return_dict_in_generate=True)
    calls = []
    packed_linear = cpu_inference.packed_linear
    monkeypatch.setattr(cpu_inference, "packed_linear", lambda *args: calls.append(args[0]) or packed_linear(*args))
    packed = model.generate(**kwargs)
    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 2 * 6 + 2 * 10 + 1  # 2 encoder layers, 2 decoder layers, the output projection
    assert all(set(module.packed) == {torch.float32} for module in linears)
    assert {id(layer) for layer in calls} == {id(layer) for layer in linears}
    calls.clear()
    plain = tiny_model(seed=2).generate(**kwargs)
    assert calls == []
    assert torch.equal(packed.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(packed.scores), torch.stack(plain.scores), atol=1e-4, rtol=1e-5)


def test_beam_search_reorders_only_the_self_attention_cache(monkeypatch) -> None:
    """The model skips reordering the encoder-decoder attention cache (equal rows within each source's beams):
    the same sequences and scores as transformers' default, which reorders both caches."""
    model = tiny_model(seed=2)
    batch = random_batch(batch=3, src_len=9)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12)
    kwargs |= dict(num_beams=4, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)
    ours = model.generate(**kwargs)
    monkeypatch.delattr(VanillaTransformerForConditionalGeneration, "_reorder_cache")
    default = model.generate(**kwargs)
    assert torch.equal(ours.sequences, default.sequences)
    assert torch.equal(ours.sequences_scores, default.sequences_scores)
    # The test means something: beams were reordered, and each source gave other scores (the cross cache matters).
    assert (ours.beam_indices[:, 1:] % 4 > 0).any()
    assert len(set(ours.sequences_scores.tolist())) == 6


@pytest.mark.parametrize("num_beams", [1, 3])
def test_static_cache_gives_the_same_tokens_as_the_dynamic_cache(num_beams: int) -> None:
    """A static cache holds unwritten slots that the causal mask must hide, even for one new token per step."""
    model = tiny_model(seed=3)
    batch = random_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=10)
    kwargs |= dict(num_beams=num_beams, do_sample=False, output_scores=True, return_dict_in_generate=True)
    dynamic = model.generate(**kwargs)
    static = model.generate(**kwargs, cache_implementation="static")
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.scores, dynamic.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Called step by step without a decoder mask: the model builds the mask that hides the unwritten slots itself.
    cache = EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=16), DynamicCache(config=model.config))
    assert_step_by_step_equals_full_forward(model, batch, "past_key_values", cache)


def test_padded_batch_equals_each_example_alone() -> None:
    model = tiny_model()
    batch = random_batch()
    together = model(**batch).logits
    generated = model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8, num_beams=2
    )
    for row in range(3):
        length = int(batch["attention_mask"][row].sum())
        alone_ids = batch["input_ids"][row : row + 1, :length]
        alone = model(input_ids=alone_ids, labels=batch["labels"][row : row + 1]).logits
        torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)
        alone_generated = model.generate(input_ids=alone_ids, max_new_tokens=8, num_beams=2)
        width = alone_generated.shape[1]
        assert torch.equal(generated[row, :width], alone_generated[0])
        assert torch.all(generated[row, width:] == model.config.pad_token_id)


def test_eager_equals_sdpa() -> None:
    batch = random_batch()
    sdpa = tiny_model()
    assert sdpa.config._attn_implementation == "sdpa"
    eager = tiny_model()
    eager.set_attn_implementation("eager")
    torch.testing.assert_close(eager(**batch).logits, sdpa(**batch).logits, atol=1e-5, rtol=1e-5)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=10)
    assert torch.equal(eager.generate(**kwargs, num_beams=3), sdpa.generate(**kwargs, num_beams=3))


def test_save_load_is_bit_exact_safetensors_only(tmp_path) -> None:
    model = tiny_model()
    batch = random_batch()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pth")) for f in files)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        keys = set(weights.keys())
    # One tensor for the 4 tied matrices; sinusoid tables are not saved.
    assert "model.shared.weight" in keys and "lm_head.weight" not in keys
    assert not any("embed_tokens" in key or "embed_positions" in key for key in keys)
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert all(not value for value in info.values()), info
    loaded.eval()
    assert loaded.lm_head.weight is loaded.model.shared.weight
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    # The non-persistent sinusoid table is recomputed, not left empty after loading on the meta device.
    table = loaded.model.encoder.embed_positions.table
    torch.testing.assert_close(table, sinusoid_table(64, 32), atol=0, rtol=0)


def test_base_model_and_lm_checkpoints_load_into_each_other(tmp_path) -> None:
    tiny_model().save_pretrained(tmp_path / "lm")
    base, info = AutoModel.from_pretrained(tmp_path / "lm", output_loading_info=True)
    assert isinstance(base, VanillaTransformerModel) and not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize(
    ("share", "tie", "stored"),
    [
        (True, True, {"model.shared.weight"}),
        (True, False, {"model.shared.weight", "lm_head.weight"}),
        (False, True, {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}),
        (False, False, {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"}),
    ],
)
def test_tying_variants_save_and_load(tmp_path, share: bool, tie: bool, stored: set[str]) -> None:
    overrides = dict(share_encoder_decoder_embeddings=share, tie_word_embeddings=tie)
    if not share:
        overrides["decoder_vocab_size"] = VOCAB - 10
    model = tiny_model(**overrides)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        embedding_keys = {k for k in weights.keys() if "embed_tokens" in k or "shared" in k or "lm_head" in k}
    assert embedding_keys == stored
    loaded, info = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert all(not value for value in info.values()), info
    ptr = loaded.lm_head.weight.data_ptr()
    assert (ptr == loaded.model.decoder.embed_tokens.weight.data_ptr()) == tie
    encoder_ptr = loaded.model.encoder.embed_tokens.weight.data_ptr()
    assert (encoder_ptr == loaded.model.decoder.embed_tokens.weight.data_ptr()) == share
    batch = random_batch()
    batch["labels"] = batch["labels"].clamp(max=VOCAB - 11)
    torch.testing.assert_close(loaded.eval()(**batch).logits, model(**batch).logits, atol=0, rtol=0)


def test_loss_is_unshifted_cross_entropy_with_ignored_labels() -> None:
    model = tiny_model()
    batch = random_batch()
    batch["labels"][0, -2:] = -100
    out = model(**batch)
    # Decoder inputs are the labels shifted right behind the start token, so logits[:, t] predicts labels[:, t].
    decoder_input_ids = torch.cat([torch.full((3, 1), 1), batch["labels"][:, :-1].clamp(min=1)], 1)
    decoder_input_ids[0, -1] = 1  # the -100 that was shifted in became padding
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
    ).logits
    torch.testing.assert_close(out.logits, logits)
    log_probs = torch.log_softmax(logits.double(), -1)
    picked = [
        -log_probs[b, t, batch["labels"][b, t]] for b in range(3) for t in range(6) if batch["labels"][b, t] >= 0
    ]
    assert math.isclose(out.loss.item(), (sum(picked) / len(picked)).item(), rel_tol=1e-5)
    summed = model(**batch, num_items_in_batch=torch.tensor(100)).loss
    assert math.isclose(summed.item(), sum(picked).item() / 100, rel_tol=1e-5)


def paper_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> float:
    """§5.4 written out in float64: the target is (1 - ε) on the label plus ε / V on every class."""
    log_probs = torch.log_softmax(logits.double(), -1)
    vocab = logits.shape[-1]
    terms = [
        -(1 - epsilon) * log_probs[b, t, labels[b, t]] - epsilon / vocab * log_probs[b, t].sum()
        for b in range(labels.shape[0])
        for t in range(labels.shape[1])
        if labels[b, t] >= 0
    ]
    return (sum(terms) / len(terms)).item()


@pytest.mark.parametrize("lm_head_bias", [False, True])
def test_label_smoothed_loss_fused_and_unfused_match_the_formula(lm_head_bias: bool) -> None:
    model = tiny_model(lm_head_bias=lm_head_bias).train()  # dropout 0 in tiny_config: both passes see one function
    batch = random_batch()
    batch["labels"][1, -3:] = -100
    unfused = model(**batch, label_smoothing=0.1)
    expected = paper_smoothed_loss(unfused.logits, batch["labels"], 0.1)
    assert math.isclose(unfused.loss.item(), expected, rel_tol=1e-5)
    grads_unfused = torch.autograd.grad(unfused.loss, list(model.parameters()))
    fused = model(**batch, label_smoothing=0.1, skip_logits=True)
    assert fused.logits is None
    assert math.isclose(fused.loss.item(), expected, rel_tol=1e-5)
    grads_fused = torch.autograd.grad(fused.loss, list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), grads_unfused, grads_fused, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4, msg=name)
    summed = model(**batch, label_smoothing=0.1, skip_logits=True, num_items_in_batch=torch.tensor(100)).loss
    assert math.isclose(summed.item(), expected * int(batch["labels"].ge(0).sum()) / 100, rel_tol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
def test_fused_loss_under_bf16_autocast_matches_the_linear_layer(chunk_size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 16, generator=gen, requires_grad=True)
    weight = torch.randn(40, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 40, (23,), generator=gen)
    labels[::4] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(hidden, weight)
        assert logits.dtype == torch.bfloat16  # what the fused path must reproduce: bf16 GEMMs
        reference = torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=0.1, reduction="sum")
        fused = linear_label_smoothed_cross_entropy(hidden, weight, None, labels, 0.1, chunk_size=chunk_size)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    for a, b in zip(
        torch.autograd.grad(reference, [hidden, weight]), torch.autograd.grad(fused, [hidden, weight]), strict=True
    ):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=0, atol=2e-2 * a.abs().max().item())  # bf16 rounding of the GEMMs
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # no gradient work, the same loss
        torch.testing.assert_close(
            linear_label_smoothed_cross_entropy(hidden, weight, None, labels, 0.1, chunk_size), fused.detach()
        )


def test_loss_options_are_checked() -> None:
    model = tiny_model()
    batch = random_batch()
    with pytest.raises(ValueError, match=r"`label_smoothing` must be in \[0, 1\), got 1.0"):
        model(**batch, label_smoothing=1.0)
    del batch["labels"]
    batch["decoder_input_ids"] = torch.ones(3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="`skip_logits=True` needs `labels`"):
        model(**batch, skip_logits=True)
    with pytest.raises(ValueError, match="`chunk_size` must be a positive number of rows, got 0"):
        linear_label_smoothed_cross_entropy(torch.ones(2, 4), torch.ones(3, 4), None, torch.zeros(2).long(), 0.1, 0)


def test_output_attentions_and_hidden_states() -> None:
    model = tiny_model()
    model.set_attn_implementation("eager")
    out = model(**random_batch(), output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == 2 and len(out.cross_attentions) == 2
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 3
    assert out.encoder_attentions[0].shape == (3, 4, 9, 9)
    assert out.cross_attentions[0].shape == (3, 4, 6, 9)
    torch.testing.assert_close(out.cross_attentions[1].sum(-1), torch.ones(3, 4, 6))
    # Padded source positions get no cross-attention.
    assert torch.all(out.cross_attentions[0][2, :, :, 5:] == 0)


def test_return_dict_false_gives_a_tuple() -> None:
    out = tiny_model()(**random_batch(), return_dict=False)
    assert isinstance(out, tuple) and out[0].ndim == 0 and out[1].shape == (3, 6, VOCAB)


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    batch = random_batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(**batch).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_sinusoids_extend_past_the_table_and_learned_positions_refuse() -> None:
    model = tiny_model()
    long_ids = torch.randint(4, VOCAB, (1, 80))  # max_position_embeddings is 64
    out = model(input_ids=long_ids, decoder_input_ids=long_ids)
    assert torch.isfinite(out.logits).all()
    learned = tiny_model(position_embedding_type="learned")
    with pytest.raises(ValueError, match="exceeds `max_position_embeddings` \\(64\\)"):
        learned(input_ids=long_ids, decoder_input_ids=long_ids[:, :5])


def test_bad_inputs_get_clear_errors() -> None:
    model = tiny_model()
    ids = torch.randint(4, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=f"token id {VOCAB}, outside the vocabulary \\[0, {VOCAB}\\)"):
        model(input_ids=torch.full((2, 5), VOCAB), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="token id -100"):
        model(input_ids=ids, decoder_input_ids=torch.full((2, 5), -100))
    with pytest.raises(ValueError, match="Batch sizes differ: 2 source rows but 3 target rows"):
        model(input_ids=ids, decoder_input_ids=torch.randint(4, VOCAB, (3, 4)))
    with pytest.raises(ValueError, match=r"Pass exactly one of `input_ids` or its `\*inputs_embeds` \(got neither\)"):
        model(decoder_input_ids=ids)
    with pytest.raises(ValueError, match=r"must hold integer token ids, got dtype torch\.float32"):
        model(input_ids=ids.float(), decoder_input_ids=ids)
    with pytest.raises(ValueError, match="`attention_mask` has shape \\(2, 4\\)"):
        model(input_ids=ids, attention_mask=torch.ones(2, 4), decoder_input_ids=ids)


def test_inputs_embeds_match_input_ids() -> None:
    model = tiny_model()
    batch = random_batch()
    embeds = model.get_input_embeddings()(batch["input_ids"])
    by_ids = model(**batch).logits
    by_embeds = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], labels=batch["labels"]).logits
    torch.testing.assert_close(by_ids, by_embeds)


def test_saved_config_carries_auto_map_and_translation_pipeline(tmp_path) -> None:
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("VanillaTransformerForConditionalGeneration")
    assert (
        config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla_translation.VanillaTranslationPipeline"
    )
    assert {p.name for p in tmp_path.glob("*.py")} == CODE_FILES
