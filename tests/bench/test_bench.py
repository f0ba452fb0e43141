"""The bench's bookkeeping: the decoding table's CTranslate2 at both of its CPU settings, the comparison with the
faster one and the targets it reports (bench/decode.py; synthetic times: no model runs here); the FLOPs behind the
MFU of a training step (bench/training.py)."""

import torch

from bench.common import build_models, make_batch, summary
from bench.decode import DECODE_TARGETS, add_best_ct2_ratios, add_ct2_times, decode_targets
from bench.training import batch_flops, train_flops, training_loss


def row(ours_ms: float, marian_ratio: float, bf16_weights_ms: float | None = None) -> dict:
    result = {"ours": {"seconds": summary([ours_ms / 1000])}, "ratio_ours_over_marian": summary([marian_ratio])}
    if bf16_weights_ms is not None:
        result["ours_bf16_weights"] = {"seconds": summary([bf16_weights_ms / 1000])}
        result["ratio_ours_bf16_weights_over_marian"] = summary([1.4])
    return result


def test_ours_is_compared_with_the_faster_ctranslate2_setting() -> None:
    fp32 = row(100, 1.6)
    add_ct2_times(fp32, "ct2_mkl_off", [0.120, 0.120, 0.125])  # 1.2x ours' time: ours 1.2x faster
    add_ct2_times(fp32, "ct2_mkl_on", [0.080, 0.090, 0.085])  # faster than ours
    add_best_ct2_ratios(fp32)
    assert round(fp32["ratio_ours_over_ct2_mkl_off"], 6) == 1.2
    assert round(fp32["ratio_ours_over_ct2_mkl_on"], 6) == 0.85
    assert fp32["ratio_ours_over_ct2_best"] == fp32["ratio_ours_over_ct2_mkl_on"]
    missing = row(100, 1.1, bf16_weights_ms=90)
    add_ct2_times(missing, "ct2_mkl_off", "n/a (CTranslate2 has no bfloat16 on this CPU: ['float32'])")
    add_best_ct2_ratios(missing)
    assert missing["ct2_mkl_off"].startswith("n/a") and "ratio_ours_over_ct2_best" not in missing


def test_targets_count_the_rows_that_reach_them() -> None:
    decode = {
        "tiny/fp32/greedy/batch1": row(100, 1.6),
        "tiny/fp32/beam4/batch16": row(100, 1.4),
        "tiny/bf16/greedy/batch1": row(100, 1.1, bf16_weights_ms=80),
        "tiny/int8/greedy/batch16": row(100, 1.2),
        "tiny/int8/greedy/batch1": row(100, 1.2),
    }
    ct2_ms = {"tiny/fp32/greedy/batch1": 90, "tiny/fp32/beam4/batch16": 110, "tiny/int8/greedy/batch16": 99}
    ct2_ms["tiny/int8/greedy/batch1"] = 85
    for key, ms in ct2_ms.items():
        add_ct2_times(decode[key], "ct2_mkl_off", [ms / 1000])
        add_best_ct2_ratios(decode[key])
    targets = {target["target"].split(" (this CPU")[0]: target for target in decode_targets(decode, "avx2 fma")}
    assert len(targets) == len(DECODE_TARGETS)
    marian = targets["ours >= 1.5x Marian in every row"]
    assert len(marian["rows"]) == 6 and marian["met"] == 1  # 5 rows and the bf16-weights one; only 1.6 reaches
    assert [label for label, _ in targets["int8 >= 1.0x CTranslate2 int8 at batch 16"]["rows"]] == [
        "tiny greedy/batch16 int8"
    ]
    assert targets["int8 >= 1.0x CTranslate2 int8 at batch 16"]["met"] == 0  # 0.99
    assert targets["int8 >= 0.8x CTranslate2 int8 at batch 1"]["met"] == 1  # 0.85
    fp32 = targets["fp32 >= 1.0x CTranslate2 float32 (its faster setting)"]
    assert [round(value, 2) for _, value in fp32["rows"]] == [0.9, 1.1] and fp32["met"] == 1
    bf16 = next(target for target in decode_targets(decode, "avx2") if target["target"].startswith("bf16 weights"))
    assert bf16["target"].endswith("(this CPU has no AMX)") and bf16["met"] == 1  # 1.4 >= 1.3
    with_amx = next(t for t in decode_targets(decode, "avx512f amx_bf16") if t["target"].startswith("bf16 autocast"))
    assert with_amx["target"].endswith("(this CPU has AMX)") and with_amx["met"] == 0  # 1.1


def test_mfu_flops_leave_out_padding() -> None:
    """batch_flops counts each sentence at its own lengths; checked against the matrix products of one sentence pair
    counted by hand (2 FLOPs per multiply-accumulate, training = 3x the forward)."""
    size = dict(vocab_size=100, d_model=8, layers=2, heads=2, ffn=32)
    d, f, v, n = 8, 32, 100, 2

    def by_hand(s: int, t: int) -> float:
        encoder = s * (4 * d * d + 2 * d * f) + 2 * s * s * d  # Q K V O, FFN; Q Kᵀ and P V
        decoder = t * (4 * d * d + 2 * d * f) + 2 * t * t * d  # self-attention and FFN
        decoder += 2 * t * d * d + 2 * s * d * d + 2 * t * s * d  # cross-attention: Q O; K V of the memory; Q Kᵀ, P V
        return 3 * 2 * (n * (encoder + decoder) + t * d * v)

    batch = make_batch([5, 3], [4, 6], 100, torch.Generator().manual_seed(0))
    assert batch_flops(size, batch) == by_hand(5, 4) + by_hand(3, 6)
    padded = train_flops(size, 2, 5, 6)  # both rows at the longest lengths
    assert padded == 2 * by_hand(5, 6) and batch_flops(size, batch) < padded


def test_batch_prep_times_budget_batches_as_the_trainer_pads_them() -> None:
    from bench.batch_prep import measure, prepare

    prepared, collator = prepare(600, "validation")
    row = measure(2000, prepared, collator, batches=3)
    assert 0 < row["target_tokens_per_batch"] <= 2000 and row["pairs_per_batch"] >= 1
    assert row["fetch_ms"] > 0 and row["collate_ms"] > 0
    assert row["both_ms"] >= max(row["fetch_ms"], row["collate_ms"]) - 1e-9


def test_compiled_ours_trains_with_the_fused_loss() -> None:
    """`torch.compile` wraps the model; the bench's compiled rows must still take our fused projection + loss
    (`skip_logits=True`), as the Trainer does, not the logits + `cross_entropy` path it gives `MarianMTModel`."""
    ours = build_models(dict(vocab_size=50, d_model=8, layers=1, heads=2, ffn=16))["ours"].eval()  # no dropout draws
    batch = make_batch([5, 3], [4, 6], 50, torch.Generator().manual_seed(0))
    seen: list[bool] = []
    ours.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("skip_logits")), with_kwargs=True
    )
    eager = training_loss(ours, batch)
    compiled = training_loss(torch.compile(ours, backend="eager"), batch)
    assert seen == [True, True]
    torch.testing.assert_close(compiled, eager)


def test_gpu_check_runs_every_step_tiny_on_the_cpu(tmp_path) -> None:
    """bench/gpu_check.sh --cpu-smoke: the GPU check's every step, tiny, so the script cannot rot between GPU loans;
    its report has a number for each of (a)-(d) and the lines `train` states about the device."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    done = subprocess.run(
        ["bash", str(root / "bench" / "gpu_check.sh"), str(tmp_path / "out"), "--cpu-smoke"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "out" / "report.txt").read_text().splitlines()
    assert report[0].startswith("(a) base model step, target tok/s: ours ") and "ours_over_marian" in report[0]
    assert report[1].startswith("(b) loop over model step: ") and " = " in report[1]
    stated = [line.split(":")[0] for line in report[2:-2]]
    assert stated == ["Device", "Precision", "TF32", "Compile", "CUDA graphs", "Static batch shapes"]
    assert report[-2].startswith("(c) multi30k-gpu: test_2016 not scored (--no-eval), ")  # the smoke does not decode
    assert " s of training " in report[-2] and " updates, " in report[-2]
    assert report[-1].startswith("(d) paper-base: ") and " h for 100,000 steps" in report[-1]
    log = (tmp_path / "out" / "train_gpu.log").read_text()
    assert "`--recipe multi30k-gpu` is sized for a GPU and this machine has none" in log  # the one-line warning
