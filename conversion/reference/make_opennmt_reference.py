"""Train tiny OpenNMT-py transformers and write OpenNMT-py's outputs, the oracle of tests/conversion/test_opennmt.py.

Runs with OpenNMT-py itself, in a side environment outside this repository (OpenNMT-py is not a dependency); the
commands and versions are in conversion/reference/opennmt_tiny/README.md. For each variant in VARIANTS it:

1. writes a toy corpus (digit strings, seeded) and an OpenNMT-py YAML config into WORK_DIR/<variant>/;
2. runs OpenNMT-py's own command lines: `onmt_build_vocab`, `onmt_train` (seeded, CPU) and `onmt_release_model`
   (which drops the optimizer state);
3. loads the released checkpoint with OpenNMT-py's `load_test_model` (as `onmt_translate` does) and writes
   `teacher_forced.safetensors`: the first N_LOGITS test pairs, right-padded as our model takes them (`input_ids`,
   `attention_mask`: the source, to which OpenNMT-py adds nothing; `decoder_input_ids`, `decoder_attention_mask`:
   decoder_start_token + target, OpenNMT-py's `tgt[:, :-1]`), the generator's `logits`, their `log_probs`
   (log_softmax, what `onmt_translate` decodes with), and `logits_fp64` from a float64 copy of the model, zero at
   padded positions;
4. runs `onmt_translate` on the N_GENERATE test sources, one sentence per batch, greedy (-beam_size 1) and with its
   default beam (5), and writes `generations.json`: the sources, each hypothesis as tokens and target ids (with the
   final </s> when the hypothesis ended with it), the length limit onmt_translate applied to each sentence, the
   versions and the checkpoints' sha256;
5. writes `model.pt`, the released checkpoint without its two sinusoid tables (`*.embeddings.make_embedding.pe.pe`,
   5000 x 1 x d_model float32 buffers that the converter recomputes and that would make the fixture several times
   larger); everything else is as OpenNMT-py saved it: `model` and `generator` state dicts, `vocab` (plain lists),
   `opt` (an argparse.Namespace of plain values) and `optim` None.

Usage: python conversion/reference/make_opennmt_reference.py OUTPUT_ROOT [--work WORK_DIR]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

N_TRAIN = 4000
N_TEST = 40
N_LOGITS = 8
TRAIN_STEPS = 1200
SEED = 1234
LETTERS = "abcdefghij"

# Variant -> (task, OpenNMT-py model options). Together they cover what a converter must tell apart: separate or
# shared vocabularies, untied / decoder-tied / three-way-tied embeddings, both sinusoid layouts, bias-free (onmt
# 3.x's default) or biased projections, relu or gelu, LayerNorm epsilon, asymmetric stacks.
VARIANTS = {
    # OpenNMT-py 3.5's defaults: no Q/K/V/output/FFN biases, interleaved sinusoids, untied embeddings over separate
    # vocabularies (digits -> letters), relu, LayerNorm eps 1e-6.
    "separate_interleaved_nobias": (
        "reverse_to_letters",
        {
            "enc_layers": 2,
            "dec_layers": 2,
            "heads": 2,
            "hidden_size": 32,
            "word_vec_size": 32,
            "transformer_ff": 64,
        },
    ),
    # One vocabulary, share_embeddings + share_decoder_embeddings, [sin | cos] sinusoids, biases everywhere, gelu,
    # eps 1e-5, 2+1 layers.
    "shared_concat_bias": (
        "reverse",
        {
            "share_vocab": True,
            "share_embeddings": True,
            "share_decoder_embeddings": True,
            "position_encoding_type": "SinusoidalConcat",
            "add_qkvbias": True,
            "add_ffnbias": True,
            "pos_ffn_activation_fn": "gelu",
            "norm_eps": 1e-5,
            "enc_layers": 2,
            "dec_layers": 1,
            "heads": 2,
            "hidden_size": 16,
            "word_vec_size": 16,
            "transformer_ff": 32,
        },
    ),
}
TRAINING = {
    "encoder_type": "transformer",
    "decoder_type": "transformer",
    "position_encoding": True,
    "dropout": [0.1],
    "attention_dropout": [0.1],
    "seed": SEED,
    "train_steps": TRAIN_STEPS,
    "save_checkpoint_steps": TRAIN_STEPS,
    "report_every": 200,
    "batch_type": "sents",
    "batch_size": 64,
    "bucket_size": 4096,
    "num_workers": 0,
    "optim": "adam",
    "adam_beta2": 0.998,
    "learning_rate": 1.0,
    "decay_method": "noam",
    "warmup_steps": 200,
    "label_smoothing": 0.1,
    "param_init": 0.0,
    "param_init_glorot": True,
    "max_grad_norm": 0.0,
}


def corpus(task: str, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """Pairs of space-separated tokens: 3-12 random digits and their reversal (digits mapped to letters for
    `reverse_to_letters`, which needs separate vocabularies)."""
    pairs = []
    for _ in range(count):
        digits = [str(rng.randrange(10)) for _ in range(rng.randint(3, 12))]
        target = digits[::-1]
        if task == "reverse_to_letters":
            target = [LETTERS[int(digit)] for digit in target]
        pairs.append((" ".join(digits), " ".join(target)))
    return pairs


def yaml_value(value: object) -> str:
    """JSON is YAML: lists, strings, numbers and booleans as OpenNMT-py's YAML config parser reads them."""
    return json.dumps(value)


def write_config(work: Path, options: dict[str, object]) -> Path:
    shared = bool(options.get("share_vocab"))
    lines = {
        "save_data": str(work / "run"),
        "src_vocab": str(work / "vocab.src"),
        "overwrite": True,
        "save_model": str(work / "model"),
        **({} if shared else {"tgt_vocab": str(work / "vocab.tgt")}),
        **TRAINING,
        **options,
    }
    text = "".join(f"{key}: {yaml_value(value)}\n" for key, value in lines.items())
    text += f"data:\n  corpus_1:\n    path_src: {work / 'train.src'}\n    path_tgt: {work / 'train.tgt'}\n"
    path = work / "config.yaml"
    path.write_text(text)
    return path


def run_onmt(command: str, *arguments: str) -> None:
    """One of OpenNMT-py's console scripts (onmt_build_vocab, ...), through its module."""
    line = [sys.executable, "-m", f"onmt.bin.{command}", *arguments]
    print("$", " ".join(line), flush=True)
    subprocess.run(line, check=True)


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into (B, L) ids and a 0/1 mask."""
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def load_released(checkpoint: Path):
    """The model as onmt_translate builds it (eval mode, dropout off)."""
    from onmt.model_builder import load_test_model
    from onmt.opts import translate_opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser()
    translate_opts(parser)
    opt = parser.parse_args(["-model", str(checkpoint), "-src", "unused"])
    vocabs, model, _model_opt = load_test_model(opt)
    return vocabs, model


@torch.no_grad()
def teacher_forced(checkpoint: Path, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """OpenNMT-py's NMTModel forward (the training forward) plus its generator, on right-padded rows."""
    vocabs, model = load_released(checkpoint)
    src_vocab, tgt_vocab = vocabs["src"], vocabs["tgt"]
    pad = src_vocab["<blank>"]
    if tgt_vocab["<blank>"] != pad:
        raise RuntimeError("source and target <blank> ids differ")
    start = vocabs["decoder_start_token"]
    sources = [src_vocab(source.split(" ")) for source, _ in pairs]
    targets = [tgt_vocab([start, *target.split(" "), "</s>"]) for _, target in pairs]
    src, src_mask = padded(sources, pad)
    tgt, _ = padded(targets, pad)
    src_len = src_mask.sum(1)
    outputs = {}
    for name, dtype in (("logits", torch.float32), ("logits_fp64", torch.float64)):
        net = model if dtype == torch.float32 else copy.deepcopy(model).double()
        dec_out, _attns = net(src.unsqueeze(-1), tgt.unsqueeze(-1), src_len)  # decodes tgt[:, :-1]
        outputs[name] = net.generator(dec_out)  # (B, T, V)
    decoder_input_ids, decoder_attention_mask = padded([row[:-1] for row in targets], pad)
    keep = decoder_attention_mask.unsqueeze(-1).bool()
    logits = outputs["logits"].float().masked_fill(~keep, 0.0)
    return {
        "input_ids": src,
        "attention_mask": src_mask,
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": decoder_attention_mask,
        "logits": logits.contiguous(),
        "log_probs": torch.log_softmax(outputs["logits"].float(), dim=-1).masked_fill(~keep, 0.0).contiguous(),
        "logits_fp64": outputs["logits_fp64"].masked_fill(~keep, 0.0).contiguous(),
    }


def translate(checkpoint: Path, work: Path, sources: list[str], tgt_vocab, eos: int, beam: int) -> dict[str, list]:
    """onmt_translate, one sentence per batch so that each sentence's length limit is its own:
    int(min(max_length 250, source length * max_length_ratio 1.25 + 5)) tokens."""
    source_file, output = work / "test.src", work / f"pred_beam{beam}.txt"
    source_file.write_text("".join(f"{line}\n" for line in sources))
    run_onmt(
        "translate",
        *("-model", str(checkpoint), "-src", str(source_file), "-output", str(output)),
        *("-beam_size", str(beam), "-batch_size", "1", "-seed", str(SEED)),
    )
    hypotheses = output.read_text().splitlines()
    limits = [int(min(250, len(source.split(" ")) * 1.25 + 5)) for source in sources]
    ids = []
    for hypothesis, limit in zip(hypotheses, limits, strict=True):
        tokens = hypothesis.split(" ") if hypothesis else []
        # An output shorter than its limit ended with </s> (which onmt_translate does not print).
        ids.append(tgt_vocab(tokens) + ([eos] if len(tokens) < limit else []))
    return {"beam": beam, "text": hypotheses, "ids": ids, "max_length": limits}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def variant(name: str, task: str, options: dict[str, object], output: Path, work: Path) -> None:
    import onmt
    import pyonmttok

    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{SEED}-{name}")
    train, test = corpus(task, N_TRAIN, rng), corpus(task, N_TEST, rng)
    (work / "train.src").write_text("".join(f"{source}\n" for source, _ in train))
    (work / "train.tgt").write_text("".join(f"{target}\n" for _, target in train))
    config = write_config(work, options)
    run_onmt("build_vocab", "-config", str(config), "-n_sample", "-1")
    run_onmt("train", "-config", str(config))
    trained = work / f"model_step_{TRAIN_STEPS}.pt"
    released = work / "released.pt"
    run_onmt("release_model", "-m", str(trained), "-o", str(released))

    output.mkdir(parents=True, exist_ok=True)
    save_file(teacher_forced(released, test[:N_LOGITS]), str(output / "teacher_forced.safetensors"))
    vocabs, _model = load_released(released)
    eos = vocabs["tgt"]["</s>"]
    sources = [source for source, _ in test]
    record = {
        "producer": os.path.relpath(__file__, Path(__file__).parents[2]),
        "opennmt_py_version": onmt.__version__,
        "torch_version": torch.__version__,
        "pyonmttok_version": pyonmttok.__version__,
        "trained_checkpoint_sha256": sha256(trained),
        "released_checkpoint_sha256": sha256(released),
        "task": task,
        "sources": sources,
        "references": [target for _, target in test],
        "greedy": translate(released, work, sources, vocabs["tgt"], eos, 1),
        "beam5": translate(released, work, sources, vocabs["tgt"], eos, 5),
    }
    # The fixture checkpoint: the released one less the two sinusoid tables (see the module docstring).
    state = torch.load(released, map_location="cpu", weights_only=False)  # OpenNMT-py's own file, trusted here
    state["model"] = {key: value for key, value in state["model"].items() if not key.endswith(".pe.pe")}
    torch.save(state, output / "model.pt")
    record["fixture_checkpoint_sha256"] = sha256(output / "model.pt")
    (output / "generations.json").write_text(json.dumps(record, indent=1) + "\n")
    for path in output.iterdir():
        path.chmod(0o644)
    print(f"Wrote {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_root", type=Path, help="Where to write the variant folders (opennmt_tiny/).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/opennmt-reference-work"), help="Scratch folder.")
    parser.add_argument("--only", choices=sorted(VARIANTS), help="Build one variant only.")
    args = parser.parse_args()
    for name, (task, options) in VARIANTS.items():
        if args.only in (None, name):
            variant(name, task, options, args.output_root / name, args.work / name)


if __name__ == "__main__":
    main()
