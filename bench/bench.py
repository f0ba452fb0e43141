"""Our model against Hugging Face's `MarianMTModel` on the same work, in one process, interleaved.

    .venv/bin/python -m bench.bench --config tiny [--json bench/results/tiny.json]

Both models get the same architecture, sizes and weights (the script checks that their logits agree), the same
batches, the same loss function and the same generation settings (bench/common.py). CTranslate2, on the same weights,
runs in a process of its own (`--ct2-worker`): beside PyTorch it slows PyTorch's small matrix products. Sections:
train, encoder and loss_curve (bench/training.py), memory (bench/memory.py), generate (bench/generate.py) and the
decoding table, decode (bench/decode.py, `make bench`). See bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch

from bench.common import CONFIGS, SETTINGS, bench_batches, environment
from bench.decode import ct2_decode_worker, decode_targets, section_decode
from bench.generate import ct2_worker, section_generate
from bench.memory import memory_worker, section_gpu_memory, section_memory
from bench.report import print_decode_table, print_report
from bench.training import check_same_function, section_encoder, section_loss_curve, section_train
from hf_vanilla_transformer.inference.cpu_inference import keep_freed_memory
from hf_vanilla_transformer.training.compiling import compile_failure
from hf_vanilla_transformer.training.trainer import resolve_bf16

# Dense bf16 tensor-core peaks in FLOP/s, by the device name torch reports, for the MFU of training steps on a GPU
# (NVIDIA's data sheets: H100 and H200 SXM 989 TFLOP/s); --peak-tflops gives it for other devices.
PEAK_FLOPS = {"H100 80GB HBM3": 989.4e12, "H200": 989.4e12}
SECTIONS = ("train", "encoder", "generate", "memory", "loss_curve", "decode")


def configure(args: argparse.Namespace) -> tuple[str, list[str], float | None]:
    """SETTINGS from the command line (the device and attention are set before the workers run); returns the
    precision line, the sections to run and the device's peak FLOP/s for the MFU (None: unknown, or the CPU)."""
    bf16, precision = resolve_bf16("yes" if args.bf16 == "only" else args.bf16, SETTINGS.device)
    SETTINGS.dtypes = ("bf16",) if args.bf16 == "only" else ("fp32", "bf16") if bf16 else ("fp32",)
    print(f"dtypes {', '.join(SETTINGS.dtypes)}: {precision}", flush=True)
    # bf16 against fp32: nothing to compare without both
    sections = [s for s in args.sections if len(SETTINGS.dtypes) == 2 or s != "loss_curve"]
    SETTINGS.token_budget = args.token_budget
    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops else None
    if SETTINGS.device.type == "cuda" and peak_flops is None:
        peak_flops = next((peak for name, peak in PEAK_FLOPS.items() if name in torch.cuda.get_device_name()), None)
    failure = None if args.no_compile else compile_failure(SETTINGS.device)
    SETTINGS.modes = ("eager",) if args.no_compile or failure else ("eager", "compiled")
    SETTINGS.compile_dynamic = None if args.compile_shapes == "dynamic" else False
    SETTINGS.compile_mode = args.compile_mode
    # Every model and dtype compiles under transformers' one forward wrapper (a graph per shape with static shapes,
    # one or more per model and dtype with dynamic ones): past dynamo's default limit of 8 graphs per function the
    # rest would run eagerly and pass for compiled rows.
    torch._dynamo.config.recompile_limit = 64
    if failure:
        print(f"eager only: torch.compile cannot work here ({failure})", flush=True)
    return precision, sections, peak_flops


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--reps", type=int, default=7, help="timed reps per measurement (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-rounds", type=int, default=3)
    parser.add_argument("--loss-steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: a lent GPU")
    parser.add_argument(
        "--attn-implementation",
        choices=("sdpa", "eager"),
        help="both models' attention kernels; default as in `hf-vanilla-transformer train`: eager on the CPU, sdpa "
        "on a GPU",
    )
    parser.add_argument(
        "--bf16",
        choices=("auto", "yes", "no", "only"),
        default="auto",
        help="measure bf16 autocast beside fp32: auto = where this device multiplies bf16 at least 2x as fast as "
        "fp32 (CPUs with AVX512-BF16/AMX, GPUs; an AVX2-only CPU emulates bf16 ~100x slower than fp32); only = bf16 "
        "autocast alone (no fp32 rows)",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=SETTINGS.token_budget,
        help="training batches: at most this many tokens (rows x longest side) on each side; 25000 is the paper's",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the device's dense bf16 peak, for the MFU of training steps (default: known for H100/H200 GPUs)",
    )
    parser.add_argument(
        "--decode-configs",
        nargs="+",
        choices=sorted(CONFIGS),
        default=["tiny", "base"],
        help="the configurations of the decode section's table",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check of the decode table: tiny only, 1 timed rep after 1 warm-up (overrides --reps/--warmup)",
    )
    parser.add_argument(
        "--malloc",
        choices=("keep", "default"),
        default="keep",
        help="keep: glibc's malloc keeps freed memory (cpu_inference.keep_freed_memory, as `translate` and `evaluate` "
        "set it) for ours and Marian alike; default: glibc's defaults. CTranslate2 runs in its own process as it is",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="train and memory sections: eager only (by default also under torch.compile, where inductor works)",
    )
    parser.add_argument(
        "--compile-shapes",
        choices=("dynamic", "static"),
        default="dynamic",
        help="train section: dynamic = torch's automatic dynamic shapes (what `train --torch-compile` gets); static "
        "= one graph per batch shape (torch.compile(dynamic=False)), to see whether kernels for fixed sizes win",
    )
    parser.add_argument(
        "--compile-mode",
        choices=("default", "max-autotune"),
        default="default",
        help="train section: torch.compile's mode; max-autotune also times inductor's GEMM templates for each shape",
    )
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--memory-worker", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--ct2-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-decode-worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = command_line()
    args = parser.parse_args(argv)
    if args.token_budget < 100:
        parser.error(f"--token-budget is {args.token_budget}; pass at least 100 tokens (25000 is the paper's)")
    if args.quick:
        args.decode_configs, args.reps, args.warmup = ["tiny"], 1, 1
    SETTINGS.device = torch.device(args.device)
    SETTINGS.attention = args.attn_implementation or ("sdpa" if SETTINGS.device.type == "cuda" else "eager")
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        print(json.dumps(memory_worker(args.config, *args.memory_worker)))
        return
    if args.ct2_worker:
        print(json.dumps(ct2_worker(args.config, args.reps, args.warmup)))
        return
    if args.ct2_decode_worker:
        print(json.dumps(ct2_decode_worker(args.decode_configs, args.reps, args.warmup)))
        return
    malloc = "keep" if args.malloc == "keep" and keep_freed_memory() else "default"
    precision, sections, peak_flops = configure(args)
    size = CONFIGS[args.config]
    batches = bench_batches(size["vocab_size"])
    results: dict[str, Any] = {"environment": environment(args.threads), "config": args.config, "size": size}
    results["environment"]["malloc"] = malloc
    results["precision"] = precision
    results["same_function_max_abs_logit_difference"] = check_same_function(size, batches[1])
    shapes = [(*b.input_ids.shape, b.labels.shape[1]) for b in batches]
    print(f"config {args.config} {size}; training batches (rows, S, T): {shapes}", flush=True)
    for section in sections:
        start = time.perf_counter()
        print(f"[{section}]", flush=True)
        if section == "train":
            results[section] = section_train(size, batches, args.reps, args.warmup, peak_flops)
        elif section == "encoder":
            results[section] = section_encoder(size, batches, args.reps, args.warmup)
        elif section == "generate":
            results[section] = section_generate(args.config, args.reps, args.warmup)
        elif section == "memory" and SETTINGS.device.type == "cuda":
            results[section] = section_gpu_memory(size, batches)
        elif section == "memory":
            results[section] = section_memory(args.config, args.memory_rounds)
        elif section == "loss_curve":
            results[section] = section_loss_curve(size, args.loss_steps)
        elif section == "decode":
            results[section] = section_decode(args.decode_configs, args.reps, args.warmup)
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    results["load_average_at_end"] = os.getloadavg()
    if set(results) & {"train", "encoder", "generate", "memory", "loss_curve"}:
        print_report(results)
    if "decode" in results:
        results["decode_targets"] = decode_targets(results["decode"], results["environment"].get("cpu_flags", ""))
        print_decode_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
