"""The linear layers of a decode step: `F.linear` against the oneDNN-packed weights (`packed_linear`) that the
layers of a model prepared for CPU inference use (`prepare_for_cpu_inference`, cpu_inference.py: float32, and bf16
autocast where oneDNN has bf16 kernels, above a size), for the row counts decoding sees.

    .venv/bin/python -m bench.packed_projection [--vocab 8000] [--d-model 256] [--d-ff 1024] [--rows 1 4 16 64 320]

Per layer shape (D -> D: attention projections, D -> F and F -> D: the FFN, D -> V: the output projection) and row
count, prints the median microseconds of each (bench.common's interleaved ABBA rounds after warm-up), their ratio
and the largest difference of the outputs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from bench.common import interleaved, summary
from hf_vanilla_transformer.inference.cpu_inference import (
    PACKED_LINEAR_MIN_MACS,
    inference_linear_dtype,
    packed_linear,
    packed_linear_dtype,
    prepare_for_cpu_inference,
)


def repeated(fn: Callable[[], torch.Tensor], calls: int) -> Callable[[], None]:
    """`fn` run `calls` times in one timed call: a single product is too short to time alone."""

    def run() -> None:
        for _ in range(calls):
            fn()

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 320])
    parser.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"), default=["fp32"])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    shapes = [(args.d_model, args.d_model), (args.d_model, args.d_ff), (args.d_ff, args.d_model)]
    shapes.append((args.d_model, args.vocab))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"(*) the packed path packs: bf16, and fp32 from {PACKED_LINEAR_MIN_MACS:,} multiply-adds")
    print("| dtype | in × out | rows | F.linear, µs | packed, µs | speed-up | max abs difference |")
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        for features_in, features_out in shapes:
            layer = prepare_for_cpu_inference(nn.Linear(features_in, features_out).eval())
            for rows in args.rows:
                hidden = torch.randn(rows, features_in)
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                    compute_dtype = packed_linear_dtype(hidden, layer.weight)
                    if compute_dtype is None:
                        raise SystemExit(f"This torch build or CPU has no oneDNN {dtype} linear: nothing to compare.")
                    fns = {
                        "linear": lambda h=hidden, m=layer: nn.functional.linear(h, m.weight, m.bias),
                        "packed": lambda h=hidden, m=layer, d=compute_dtype: packed_linear(m, h, d),
                    }
                    calls = max(5, 40_000_000 // (rows * features_in * features_out))  # a few ms per timed call
                    timed = {name: repeated(fn, calls) for name, fn in fns.items()}
                    seconds, _, _ = interleaved(timed, args.rounds, 5)
                    difference = float((fns["linear"]().float() - fns["packed"]().float()).abs().max())
                    chosen = "" if inference_linear_dtype(hidden, layer.weight) is None else "*"
                times = {name: summary(values)["median"] / calls * 1e6 for name, values in seconds.items()}
                speedup = times["linear"] / times["packed"]
                print(
                    f"| {dtype} | {features_in} × {features_out} | {rows} | {times['linear']:,.0f} | "
                    f"{times['packed']:,.0f}{chosen} | {speedup:.2f}× | {difference:.1e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
