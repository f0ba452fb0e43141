"""The tables `python -m bench.bench` prints: one for its train, encoder, generate, memory and loss-curve sections,
one for the decoding table and its targets."""

from __future__ import annotations

from typing import Any

from bench.common import NEW_TOKENS, SETTINGS, fmt
from bench.decode import CT2_SETTINGS


def run_line(results: dict[str, Any]) -> str:
    """Where and with what a run measured: the date, the host, the device, threads, versions, allocator and load."""
    env = results["environment"]
    return (
        f"{env['date']}, {env['cpu']} ({env['cpu_count']} logical cores; {env.get('cpu_flags', '')}), "
        f"{env['threads']} threads, {env.get('device', 'cpu')}, {env.get('attn_implementation', 'sdpa')} attention, "
        f"torch {env['torch']}, transformers {env['transformers']}, ctranslate2 {env.get('ctranslate2', '-')}; "
        f"PyTorch side's malloc: {env.get('malloc', 'default')}; "
        f"load {env['load_average_at_start']} -> {results.get('load_average_at_end')}"
    )


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print(f"\n{run_line(results)}")
    print("medians [interquartile range]; ratios are medians of per-rep ratios (> 1: ours faster or smaller)")
    print("| measure | ours | Marian | ours/Marian |\n|---|---|---|---|")
    if "train" in results:
        train = results["train"]
        for dtype in SETTINGS.dtypes:
            row = train[dtype]
            print(
                f"| train step {dtype}, target tok/s | {fmt(row['ours']['target_tokens_per_s'])} | "
                f"{fmt(row['marian']['target_tokens_per_s'])} | {fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
        for dtype in SETTINGS.dtypes:
            row = train[dtype]
            print(
                f"| train {dtype}: GEMM ceiling {row['gemm_ceiling'] / 1e9:.0f} GFLOP/s, achieved | "
                f"{row['ours']['achieved_flops_per_s'] / 1e9:.0f} GFLOP/s = "
                f"{100 * row['ours']['fraction_of_gemm_ceiling']:.0f}% | "
                f"{row['marian']['achieved_flops_per_s'] / 1e9:.0f} GFLOP/s = "
                f"{100 * row['marian']['fraction_of_gemm_ceiling']:.0f}% | |"
            )
        for dtype in SETTINGS.dtypes:
            row = train[dtype]
            if "ours_compiled" not in row:
                continue
            print(
                f"| train step {dtype} compiled, target tok/s | {fmt(row['ours_compiled']['target_tokens_per_s'])} | "
                f"{fmt(row['marian_compiled']['target_tokens_per_s'])} | "
                f"{fmt(row['ratio_ours_compiled_over_marian_compiled'], digits=3)} |"
            )
            print(
                f"| train {dtype}: compiled / eager speed-up | "
                f"{fmt(row['ratio_ours_compiled_over_ours'], digits=3)} | "
                f"{fmt(row['ratio_marian_compiled_over_marian'], digits=3)} | |"
            )
            print(
                f"| train {dtype}: ours compiled / Marian eager | | | "
                f"{fmt(row['ratio_ours_compiled_over_marian'], digits=3)} |"
            )
            print(
                f"| train {dtype} compiled: first call (compiling), s | "
                f"{row['ours_compiled']['first_call_seconds']:.0f} ({row['ours_compiled']['graphs']} graphs) | "
                f"{row['marian_compiled']['first_call_seconds']:.0f} ({row['marian_compiled']['graphs']} graphs) | |"
            )
        if train.get("peak_flops_per_s"):
            for dtype in SETTINGS.dtypes:
                row, peak = train[dtype], train["peak_flops_per_s"] / 1e12
                cells = [
                    f"{100 * row[name]['mfu']:.1f}%" if name in row else ""
                    for name in ("ours", "marian", "ours_compiled", "marian_compiled")
                ]
                print(f"| train {dtype}: MFU (of {peak:.0f} TFLOP/s), eager | {cells[0]} | {cells[1]} | |")
                if cells[2]:
                    print(f"| train {dtype}: MFU (of {peak:.0f} TFLOP/s), compiled | {cells[2]} | {cells[3]} | |")
        if "ours_bf16_over_fp32" in train:
            print(
                f"| train bf16 / fp32 speed-up | {fmt(train['ours_bf16_over_fp32'], digits=2)} | "
                f"{fmt(train['marian_bf16_over_fp32'], digits=2)} | |"
            )
    if "encoder" in results:
        for dtype in SETTINGS.dtypes:
            row = results["encoder"][dtype]
            print(
                f"| encoder forward {dtype}, source tok/s | {fmt(row['ours']['source_tokens_per_s'])} | "
                f"{fmt(row['marian']['source_tokens_per_s'])} | {fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
    if "generate" in results:
        for key, row in results["generate"].items():
            print(
                f"| generate {key}, ms | {fmt(row['ours']['seconds'], 1e3, 1)} | "
                f"{fmt(row['marian']['seconds'], 1e3, 1)} | "
                f"{fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
        for key, row in results["generate"].items():
            for name in ("ct2_float32", "ct2_int8"):
                if name in row:
                    print(
                        f"| generate {key} against CTranslate2 {name[4:]}, ms | {fmt(row['ours']['seconds'], 1e3, 1)} "
                        f"| {fmt(row[name]['seconds'], 1e3, 1)} (CTranslate2, own process) | "
                        f"{row[f'ratio_ours_over_{name}']:.3f} (ratio of medians) |"
                    )
    if "memory" in results:
        memory = results["memory"]
        memory_kind = "RSS" if env.get("device", "cpu") == "cpu" else "GPU memory"
        for dtype in SETTINGS.dtypes:
            print(
                f"| peak {memory_kind} of training steps {dtype}, MB | "
                f"{fmt(memory[f'ours/{dtype}']['peak_rss_mb'])} | "
                f"{fmt(memory[f'marian/{dtype}']['peak_rss_mb'])} | "
                f"{1 / memory[f'ratio_ours_over_marian/{dtype}']:.3f} |"
            )
            if f"ours_compiled/{dtype}" in memory:
                print(
                    f"| peak {memory_kind} of training steps {dtype} compiled, MB | "
                    f"{fmt(memory[f'ours_compiled/{dtype}']['peak_rss_mb'])} | "
                    f"{fmt(memory[f'marian_compiled/{dtype}']['peak_rss_mb'])} | "
                    f"{1 / memory[f'ratio_ours_compiled_over_marian_compiled/{dtype}']:.3f} |"
                )
    if "loss_curve" in results:
        curve = results["loss_curve"]
        print(
            f"\nbf16 autocast vs fp32 loss ({len(curve['fp32'])} steps, same seed): max relative difference "
            f"{curve['max_relative_difference']:.4f}, mean over the last quarter "
            f"{curve['mean_relative_difference_last_quarter']:.4f}; final loss fp32 {curve['fp32'][-1]:.4f}, "
            f"bf16 {curve['bf16'][-1]:.4f}"
        )
    if "same_function_max_abs_logit_difference" in results:
        difference = results["same_function_max_abs_logit_difference"]
        print(f"max |logits ours - logits Marian| (eval, same weights): {difference:.2e}")


def print_decode_table(results: dict[str, Any]) -> None:
    """One table: ms per generate() call (median [IQR]) and speed ratios (> 1: ours faster); then the targets."""
    print(f"\nDecoding, {NEW_TOKENS} new tokens per row; {run_line(results)}")
    print(
        "ours/Marian: median of per-rep ratios (interleaved); ours/CT2: ratio of medians (CTranslate2 in its own "
        "process, CT2_USE_MKL=0 / 1, best = against the faster); Marian int8 = torch dynamic quantization; bf16 = "
        "autocast (ours/Marian), bfloat16 (CT2)"
    )
    print(
        "| config | case | dtype | ours ms | Marian ms | ours/Marian | CT2 ms (MKL off / on) | ours/CT2 (off / on) "
        "| ours/CT2 best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(value: Any, scale: float = 1e3, digits: int = 1) -> str:  # "n/a" alone: the reason is in the JSON
        return (
            value.split(" (")[0] if isinstance(value, str) else fmt(value["seconds"], scale, digits) if value else "-"
        )

    def ratio(value: float | None) -> str:
        return f"{value:.2f}" if value else "-"

    for key, row in results["decode"].items():
        config, dtype, case = key.split("/", 2)
        variants = [("ours", dtype)] + ([("ours_bf16_weights", "bf16 weights")] if "ours_bf16_weights" in row else [])
        for name, label in variants:
            marian_ratio = row.get(f"ratio_{name}_over_marian")
            ct2 = " / ".join(cell(row.get(f"ct2_{setting}")) for setting in CT2_SETTINGS)
            ct2_ratios = " / ".join(ratio(row.get(f"ratio_{name}_over_ct2_{setting}")) for setting in CT2_SETTINGS)
            print(
                f"| {config} | {case} | {label} | {cell(row.get(name))} | {cell(row.get('marian'))} | "
                f"{fmt(marian_ratio, digits=2) if marian_ratio else '-'} | {ct2} | {ct2_ratios} | "
                f"{ratio(row.get(f'ratio_{name}_over_ct2_best'))} |"
            )
    print(
        "\nTargets (medians of per-rep ratios against Marian, ratios of medians against CTranslate2's faster setting):"
    )
    print("| target | rows | met |")
    print("|---|---|---|")
    for target in results["decode_targets"]:
        rows = ", ".join(f"{label} {value:.2f}" for label, value in target["rows"])
        met = f"{target['met']} of {len(target['rows'])}"
        print(f"| {target['target']} | {rows or '-'} | {met} |")
