"""int8 inference (quantization.py): int8 kernels run in place of every float32 (packed) linear, the logits and
greedy tokens stay those of float32 within a tolerance, and `translate`/`evaluate --int8` work from the command line
(with a one-line error where torch has no int8 kernels)."""

import pytest
import torch
from torch import nn
from torch.profiler import profile

from hf_vanilla_transformer.inference import decoding, quantization
from hf_vanilla_transformer.inference.cpu_inference import prepare_for_cpu_inference
from hf_vanilla_transformer.inference.loading import load_model
from hf_vanilla_transformer.inference.quantization import Int8Linear, quantize_int8

from ..conftest import random_batch, run, tiny_model, tiny_tokenizer


def op_names(model: nn.Module, batch: dict[str, torch.Tensor]) -> set[str]:
    with profile() as prof, torch.no_grad():
        model(**batch)
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("kernel", ["quantized::linear_dynamic", "aten::_weight_int8pack_mm"])
def test_int8_kernels_replace_every_linear_and_keep_the_logits_close(kernel: str, monkeypatch) -> None:
    """FBGEMM's dynamic int8 layers, or for small products the same int8 weights times bf16 inputs (every product of
    the tiny model is small: the threshold is set to 0 to test FBGEMM's)."""
    if kernel == "quantized::linear_dynamic":
        monkeypatch.setattr(quantization, "WEIGHT_ONLY_MAX_MACS", 0)
    elif not quantization.weight_only_kernel():
        pytest.skip("no fast bf16 on this CPU: the int8 layers take FBGEMM's kernel at every size")
    model, batch = tiny_model(), random_batch()
    with torch.no_grad():
        reference = model(**batch).logits
    assert "aten::linear" in op_names(model, batch)  # the float32 model's layers: what int8 must replace
    quantized = quantize_int8(model)
    assert quantized is model and not any(type(module) is nn.Linear for module in model.modules())
    names = op_names(model, batch)
    assert kernel in names
    assert not {"aten::linear", "aten::addmm", "mkldnn::_linear_pointwise"} & names  # no float32 product left
    with torch.no_grad():
        logits = model(**batch).logits
    # int8 weights (per row) and inputs (per call): a few percent of the logits' range at most (1.7% measured).
    assert (logits - reference).abs().max() <= 0.05 * reference.abs().max()


def test_int8_quantizes_a_model_prepared_for_cpu_inference() -> None:
    """`quantize_int8` after `prepare_for_cpu_inference`: the prepared layers (`PackedLinear`, which
    `quantize_dynamic`'s exact-class mapping would skip) are quantized too, with the logits of the plain order."""
    plain, prepared, batch = tiny_model(), tiny_model(), random_batch()
    quantize_int8(plain)
    quantize_int8(prepare_for_cpu_inference(prepared))
    assert not any(isinstance(module, nn.Linear) for module in prepared.modules())
    with torch.no_grad():
        torch.testing.assert_close(prepared(**batch).logits, plain(**batch).logits, rtol=0, atol=0)


def test_int8_greedy_tokens_stay_those_of_float32() -> None:
    """The tolerance: of 16 greedy outputs of an untrained model (small logit margins, the hard case), at least 14
    identical; a trained model's margins are larger (the Multi30k BLEU in docs/results.md)."""
    model, batch = tiny_model(), random_batch(batch=16)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=1)
    with torch.no_grad():
        reference = model.generate(**kwargs, max_new_tokens=8)
        quantize_int8(model)
        tokens = model.generate(**kwargs, max_new_tokens=8)
    assert tokens.shape[0] == reference.shape[0] == 16
    same = sum(torch.equal(a, b) for a, b in zip(tokens, reference, strict=True))
    assert same >= 14, same


def test_int8_refuses_a_model_off_the_cpu() -> None:
    model = tiny_model().to("meta")
    with pytest.raises(ValueError, match=r"CPU only.*\['meta'\].*drop `int8`"):
        quantize_int8(model)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny model with the word-level tokenizer, saved."""
    folder = tmp_path_factory.mktemp("int8") / "model"
    tiny_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def linear_kinds(model: nn.Module) -> set[str]:
    """The classes of `model`'s linear layers: float (`nn.Linear` and its subclasses, `PackedLinear` included) or
    int8 (`Int8Linear`)."""
    return {type(module).__name__ for module in model.modules() if isinstance(module, (nn.Linear, Int8Linear))}


def watch_decoding_models(monkeypatch) -> list[set[str]]:
    """Each decoding call's `linear_kinds` (translate's and evaluate's), recorded in the returned list."""
    seen = []
    translate_n_best = decoding.translate_n_best

    def watch(model, *args, **kwargs):
        seen.append(linear_kinds(model))
        return translate_n_best(model, *args, **kwargs)

    monkeypatch.setattr(decoding, "translate_n_best", watch)  # evaluate's decoding
    monkeypatch.setattr("hf_vanilla_transformer.inference.translation.translate_n_best", watch)  # translate's
    return seen


def test_load_model_with_int8_quantizes_every_linear(folder) -> None:
    """`load_model(int8=True)`, what `--int8` loads: every linear layer int8, none left in float32."""
    assert linear_kinds(load_model(folder, device="cpu", int8=True)) == {"Int8Linear"}
    assert "Int8Linear" not in linear_kinds(load_model(folder, device="cpu"))


def test_translate_and_evaluate_with_int8(folder, capsys, tmp_path, monkeypatch) -> None:
    """`--int8` decodes with the int8 model (every linear layer `Int8Linear`), and without it the float one."""
    seen = watch_decoding_models(monkeypatch)
    sentences = ["w4 w5 w6", "w7 w8", "w9 w10 w11 w12"]
    argv = ["translate", str(folder), *sentences, "--num-beams", "1"]
    code, fp32, _ = run(argv, capsys)
    assert code == 0 and len(fp32.splitlines()) == 3
    assert len(seen) == 1 and "Int8Linear" not in seen[0], seen
    code, int8, _ = run([*argv, "--int8"], capsys)
    assert code == 0 and len(int8.splitlines()) == 3
    assert seen[1:] == [{"Int8Linear"}], seen
    (tmp_path / "src.txt").write_text("\n".join(sentences) + "\n")
    (tmp_path / "ref.txt").write_text(int8)  # the int8 translations as references: evaluate --int8 scores 100
    argv = ["evaluate", str(folder), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    code, out, _ = run([*argv, "--num-beams", "1", "--int8", "--no-progress"], capsys)
    assert code == 0 and out.startswith("BLEU 100.00"), out
    assert seen[2:] == [{"Int8Linear"}], seen


def test_the_translation_pipeline_takes_an_int8_model(folder) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    model = quantize_int8(AutoModelForSeq2SeqLM.from_pretrained(folder))
    translator = pipeline("translation", model=model, tokenizer=AutoTokenizer.from_pretrained(folder))
    with profile() as prof:
        output = translator(["w4 w5 w6"], max_new_tokens=4)
    assert isinstance(output[0]["translation_text"], str)
    names = {event.key for event in prof.key_averages()}
    assert {"quantized::linear_dynamic", "aten::_weight_int8pack_mm"} & names and "aten::linear" not in names


def test_int8_without_int8_kernels_is_one_line_naming_the_fix(folder, capsys, monkeypatch) -> None:
    monkeypatch.delattr(torch.ao.quantization, "quantize_dynamic")  # a torch that dropped dynamic quantization
    code, _, err = run(["translate", str(folder), "w4 w5", "--int8"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "`--int8`" in err and "torch.ao.quantization.quantize_dynamic" in err and "pip install" in err


@pytest.mark.skipif(not quantization.weight_only_kernel(), reason="no fast bf16 on this CPU: FBGEMM at every size")
def test_small_int8_products_multiply_the_int8_weights_by_bf16_inputs() -> None:
    """Below WEIGHT_ONLY_MAX_MACS an int8 layer computes x · (int8 weight × row scale)ᵀ + b with x in bf16, the
    scales in bf16 and the result rounded to bf16: within 1% of that product in float32 (FBGEMM's 7-bit inputs are
    off by several percent); larger products take FBGEMM's kernel (the parent's forward, bit for bit); replaced
    weights (load_state_dict) are followed."""
    model = nn.Sequential(nn.Linear(64, 48)).eval()
    quantize_int8(model)
    layer = model[0]
    assert isinstance(layer, quantization.Int8Linear)

    def dequantized_product(hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = layer._weight_bias()
        scales = weight.q_per_channel_scales().float()
        return hidden @ (weight.int_repr().float() * scales[:, None]).t() + bias  # (..., 64) -> (..., 48)

    hidden = torch.randn(2, 3, 64)
    assert 2 * 3 * 64 * 48 < quantization.WEIGHT_ONLY_MAX_MACS
    with torch.no_grad():
        expected = dequantized_product(hidden)
        got = layer(hidden)
        assert got.shape == (2, 3, 48) and got.dtype == torch.float32
        assert (got - expected).abs().max() <= 0.01 * expected.abs().max()
        fbgemm = quantization.DynamicInt8Linear.forward(layer, hidden)
        assert (fbgemm - expected).abs().max() > (got - expected).abs().max()  # 7-bit inputs: further off
        large = torch.randn(200, 64)  # 200 x 64 x 48 > WEIGHT_ONLY_MAX_MACS
        assert torch.equal(layer(large), quantization.DynamicInt8Linear.forward(layer, large))
        replacement = nn.Sequential(nn.Linear(64, 48)).eval()
        model.load_state_dict(quantize_int8(replacement).state_dict())
        moved = dequantized_product(hidden)
        assert not torch.allclose(moved, expected)
        assert (layer(hidden) - moved).abs().max() <= 0.01 * moved.abs().max()


def test_int8_model_refuses_to_be_saved_before_writing_anything(tmp_path) -> None:
    """safetensors cannot store the int8 layers' packed weights: save_pretrained and push_to_hub of a quantized
    model raise a ValueError naming the fix, before the folder is created; the float model still saves."""
    model = quantize_int8(tiny_model())
    target = tmp_path / "int8"
    with pytest.raises(ValueError) as error:
        model.save_pretrained(target)
    message = str(error.value)
    assert message.startswith("save_pretrained of a model quantized with quantize_int8 (`int8`)")
    assert "int8 layers are for inference only" in message and "\n" not in message
    assert "save the float model (load it again without `int8`) and quantize after loading" in message
    assert not target.exists()
    with pytest.raises(ValueError, match=r"^push_to_hub of a model quantized with quantize_int8"):
        model.push_to_hub("me/int8")
    tiny_model().save_pretrained(tmp_path / "float")  # the class is untouched
    assert (tmp_path / "float" / "model.safetensors").is_file()
