"""The output projection of a decode step: `F.linear` against the oneDNN-packed weight that
`project_to_vocabulary` uses for float32 CPU inference, for the row counts decoding sees.

    .venv/bin/python -m bench.packed_projection [--vocab 8000] [--d-model 256] [--rows 1 4 16 64 320]

Prints, per row count, the median microseconds of each (bench.bench's interleaved ABBA rounds after warm-up) and
their ratio.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from bench.bench import interleaved, summary
from hf_vanilla_transformer.modeling_vanilla_transformer import onednn_linear_applies, project_to_vocabulary


def repeated(fn: Callable[[], torch.Tensor], calls: int) -> Callable[[], None]:
    """`fn` run `calls` times in one timed call: a single projection is too short to time alone."""

    def run() -> None:
        for _ in range(calls):
            fn()

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 320])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    lm_head = nn.Linear(args.d_model, args.vocab, bias=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, V {args.vocab}, D {args.d_model}")
    print("| rows | F.linear, µs | packed, µs | speed-up | max abs difference |")
    print("|---|---|---|---|---|")
    with torch.no_grad():
        for rows in args.rows:
            hidden = torch.randn(rows, args.d_model)
            if not onednn_linear_applies(hidden, lm_head.weight):
                raise SystemExit("This torch build or device has no oneDNN linear: nothing to compare.")
            fns = {
                "linear": lambda hidden=hidden: lm_head(hidden),
                "packed": lambda hidden=hidden: project_to_vocabulary(hidden, lm_head),
            }
            calls = max(5, 2000 // rows)
            seconds, _, _ = interleaved({name: repeated(fn, calls) for name, fn in fns.items()}, args.rounds, 5)
            times = {name: summary(values)["median"] / calls * 1e6 for name, values in seconds.items()}
            difference = float((fns["linear"]() - fns["packed"]()).abs().max())
            speedup = times["linear"] / times["packed"]
            print(f"| {rows} | {times['linear']:,.0f} | {times['packed']:,.0f} | {speedup:.2f}× | {difference:.1e} |")


if __name__ == "__main__":
    main()
