"""`hf-vanilla-transformer train` (cli.main, unchanged) with test hooks, for tests/training/test_faults.py and
tests/training/test_distributed.py. Run as a subprocess, alone or under torchrun:

    python tests/train_script.py [hook options] -- train --train-src ... --preset transformer-test ...

Hooks (none changes the numbers that training computes):
- the preset `transformer-test` (1+1 layers, d_model 32, P_drop 0.1) for seconds-long runs;
- `--save-steps K`: a checkpoint every K updates as well (the CLI saves by time and at epoch ends);
- `--pause-at N`: once N updates are done (and any checkpoint at N is written), write OUTPUT_DIR/paused-at-N and
  sleep, to be killed from outside with SIGKILL;
- `--kill-in-save N`: SIGKILL itself in the middle of writing checkpoint-N (after the weights and the optimizer,
  before rng_state.pth and trainer_state.json, which the Trainer writes last);
- `--trace FOLDER`: record every file this process writes (paths, one a line) in FOLDER/writes-rank<RANK>.txt, and
  whether the command left its process group initialized in FOLDER/group-at-exit-rank<RANK>.txt;

`write_corpus` and `run` are the tests' side: the data, and the subprocess with its environment.
"""

import argparse
import builtins
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TEST_PRESET = dict(N=1, d_model=32, d_ff=64, h=4, P_drop=0.1)
MAX_TOKENS = 48  # the 64 pairs of `write_corpus` then make 10 batches per epoch


def reversal_pairs(n: int) -> tuple[list[str], list[str]]:
    """`n` sentences of 1 to 9 words over w4 ... w60 (always the same ones) and the same words reversed."""
    rng = random.Random(0)
    sources, targets = [], []
    for _ in range(n):
        words = [f"w{rng.randint(4, 60)}" for _ in range(rng.randint(1, 9))]
        sources.append(" ".join(words))
        targets.append(" ".join(reversed(words)))
    return sources, targets


def write_corpus(folder: Path) -> Path:
    """64 reversal pairs over w4 ... w60 as train.src/train.tgt, 3 of them as test.src/test.tgt, and the tests'
    word-level tokenizer (conftest.tiny_tokenizer) in folder/tokenizer."""
    from .conftest import tiny_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer().save_pretrained(folder / "tokenizer")
    sources, targets = reversal_pairs(64)
    for name, lines in (("train.src", sources), ("train.tgt", targets), ("test.src", sources[:3])):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "test.tgt").write_text("\n".join(targets[:3]) + "\n", encoding="utf-8")
    return folder


def train_args(corpus: Path, output_dir: Path, max_steps: int, *extra: str) -> list[str]:
    """`train` options for a seconds-long run of the test preset on `write_corpus` data (no test-set evaluation
    unless `extra` names a test set)."""
    return [
        *("train", "--train-src", str(corpus / "train.src"), "--train-tgt", str(corpus / "train.tgt")),
        *("--tokenizer", str(corpus / "tokenizer"), "--preset", "transformer-test"),
        *("--max-tokens", str(MAX_TOKENS), "--max-steps", str(max_steps), "--save-every", "1h"),
        *("--schedule", "inverse_sqrt", "--lr", "3e-3", "--warmup-steps", "5", "--seed", "3"),
        *("--logging-steps", "1", "--no-progress", "--output-dir", str(output_dir)),
        *(extra if "--test-src" in extra else ("--no-eval", *extra)),
    ]


def environment(**extra: str) -> dict[str, str]:
    """One thread per process (bit-exact comparisons need the same reduction order) and the repository on the path
    (model_card, as an installed package would have it)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def command(hooks: list[str], args: list[str], nproc: int = 1, port: int | None = None) -> list[str]:
    script = [str(REPO / "tests" / "train_script.py"), *hooks, "--", *args]
    if nproc == 1:
        return [sys.executable, *script]
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port)]
    return [sys.executable, *launcher, *script]


def run(hooks: list[str], args: list[str], nproc: int = 1, port: int | None = None, **env: str):
    """Run the script to its end (at most 5 minutes); stdout and stderr together in `.stdout`."""
    return subprocess.run(
        command(hooks, args, nproc, port),
        cwd=REPO,
        env=environment(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def _trace_writes(folder: Path) -> None:
    """Wrap the file writers (open for writing, safetensors, torch.save) to log each written path; files written
    by Rust or C++ code of their own (the tokenizers library's tokenizer.json) are not seen."""
    import safetensors.torch
    import transformers.modeling_utils

    import hf_vanilla_transformer.training.averaging

    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"writes-rank{os.environ.get('RANK', '0')}.txt"
    original_open = builtins.open

    def record(path) -> None:
        with original_open(log_path, "a", encoding="utf-8") as log:
            log.write(f"{Path(path).resolve()}\n")

    def traced_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(flag in mode for flag in "wax+"):
            record(file)
        return original_open(file, mode, *args, **kwargs)

    def traced_save_file(original):
        def save_file(tensors, filename, *args, **kwargs):
            record(filename)
            return original(tensors, filename, *args, **kwargs)

        return save_file

    torch_save = torch.save

    def traced_torch_save(obj, f, *args, **kwargs):  # writes through C++, not through open()
        if isinstance(f, (str, os.PathLike)):
            record(f)
        return torch_save(obj, f, *args, **kwargs)

    builtins.open = io.open = traced_open  # pathlib's write_text opens with io.open
    torch.save = traced_torch_save
    transformers.modeling_utils.safe_save_file = traced_save_file(transformers.modeling_utils.safe_save_file)
    hf_vanilla_transformer.training.averaging.save_file = traced_save_file(
        hf_vanilla_transformer.training.averaging.save_file
    )
    safetensors.torch.save_file = traced_save_file(safetensors.torch.save_file)


def _install_hooks(hooks: argparse.Namespace, output_dir: Path) -> None:
    from transformers import Trainer, TrainerCallback

    import hf_vanilla_transformer.training.trainer as training

    class TestHooks(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if hooks.save_steps and state.global_step % hooks.save_steps == 0:
                control.should_save = True

        def on_step_begin(self, args, state, control, **kwargs):
            # Called before update global_step + 1: update N and any checkpoint at N are complete.
            if hooks.pause_at is not None and state.global_step == hooks.pause_at and state.is_world_process_zero:
                (output_dir / f"paused-at-{hooks.pause_at}").write_text("", encoding="utf-8")
                time.sleep(600)

    class HookedTrainer(training.VanillaSeq2SeqTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(TestHooks())

    training.VanillaSeq2SeqTrainer = HookedTrainer  # the CLI imports it from the module when `train` runs

    if hooks.kill_in_save is not None:
        save_rng_state = Trainer._save_rng_state

        def killing_save_rng_state(self, output_dir):
            if self.state.global_step == hooks.kill_in_save:
                os.kill(os.getpid(), signal.SIGKILL)
            return save_rng_state(self, output_dir)

        Trainer._save_rng_state = killing_save_rng_state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-steps", type=int)
    parser.add_argument("--pause-at", type=int)
    parser.add_argument("--kill-in-save", type=int)
    parser.add_argument("--trace", type=Path)
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    hooks = parser.parse_args()
    cli_args = hooks.cli_args[1:] if hooks.cli_args[:1] == ["--"] else hooks.cli_args
    torch.set_num_threads(1)  # bit-exact comparisons between runs need the same reduction order

    from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS

    PRESETS["transformer-test"] = TEST_PRESET
    output_dir = Path(cli_args[cli_args.index("--output-dir") + 1])
    _install_hooks(hooks, output_dir)
    if hooks.trace is not None:
        _trace_writes(hooks.trace)

    from hf_vanilla_transformer.cli import main as cli_main

    code = cli_main(cli_args)
    if hooks.trace is not None:  # what the command leaves to the interpreter's exit: a live gloo group can abort it
        state = "initialized" if torch.distributed.is_initialized() else "destroyed"
        (hooks.trace / f"group-at-exit-rank{os.environ.get('RANK', '0')}.txt").write_text(state)
    return code


if __name__ == "__main__":
    sys.exit(main())
