"""Write fairseq's own outputs, the oracle of tests/conversion/test_fairseq.py.

Runs with fairseq itself, in a side environment outside this repository (fairseq is not a dependency):

    ~/.pyenv/versions/3.10.13/bin/python -m venv /tmp/fsenv
    /tmp/fsenv/bin/pip install "pip<24.1" "torch==2.1.2" "numpy<2" "cython<3" "setuptools<70" wheel safetensors
    # fairseq 0.12.2's sdist lacks clib/libbase/balanced_assignment.cpp: build it without the torch C++
    # extensions (none is used for inference) by making `from torch.utils import cpp_extension` in its setup.py
    # raise ImportError, then `pip install --no-build-isolation .` in the unpacked sdist.
    OMP_NUM_THREADS=1 /tmp/fsenv/bin/python conversion/reference/make_fairseq_reference.py \
        ../shared/fixtures/fairseq_transformer_sym2math conversion/reference

Writes under OUTPUT_ROOT:
- `fairseq_sym2math/`, for the fixture checkpoint (old `args` format, separate dictionaries, untied, post-LN,
  sinusoids):
  - `teacher_forced.safetensors`: the first N_LOGITS test pairs, right-padded as our model takes them:
    `input_ids`, `attention_mask` (source + </s>), `decoder_input_ids`, `decoder_attention_mask` (</s> +
    target[:-1], fairseq's prev_output_tokens) and fairseq's `logits` in fp32 and, from a float64 copy of the model,
    `logits_fp64` (zero at padded positions). fairseq ran on its own collated batch (left-padded sources); rows are
    put back in dataset order.
  - `generations.json`: fairseq's best hypothesis (token ids, final </s> included, and its score) for the first
    N_GENERATE test sentences with `fairseq-generate`'s defaults (max_len_a 0, max_len_b 200, min_len 1, lenpen 1,
    unkpen 0) at beam 1 (greedy) and beam 5, plus the versions and the checkpoint hash.
- `fairseq_tiny_<variant>/`: tiny models built and saved by fairseq's own Trainer (new `cfg` format), weights
  randomised (seeded) so that no two LayerNorms or biases are alike, with their dictionaries and the same two
  files for random sentences. The variants cover what the fixture does not (TINY_VARIANTS).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
from pathlib import Path

import fairseq
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from safetensors.torch import save_file

N_LOGITS = 8
N_GENERATE = 100
BATCH = 25
BEAMS = {"greedy": 1, "beam5": 5}
# Tiny models: fairseq-train arguments, and the source/target dictionary sizes (equal sizes = one joined dict).
TINY_VARIANTS = {
    # Three-way tying, pre-LN with fairseq's final LayerNorms, learned positions, GELU, 2+1 layers, 4/2 heads.
    "shareall_preln_learned": (
        "--share-all-embeddings --encoder-normalize-before --decoder-normalize-before --encoder-learned-pos "
        "--decoder-learned-pos --activation-fn gelu --encoder-embed-dim 16 --decoder-embed-dim 16 "
        "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-layers 2 --decoder-layers 1 "
        "--encoder-attention-heads 4 --decoder-attention-heads 2 --max-source-positions 64 --max-target-positions 64",
        (24, 24),
    ),
    # Decoder input/output tying over separate dictionaries, post-LN, sinusoids, unscaled embeddings, FFN 20/24.
    "sharedecoder_unscaled": (
        "--share-decoder-input-output-embed --no-scale-embedding --encoder-embed-dim 12 --decoder-embed-dim 12 "
        "--encoder-ffn-embed-dim 20 --decoder-ffn-embed-dim 24 --encoder-layers 1 --decoder-layers 2 "
        "--encoder-attention-heads 3 --decoder-attention-heads 3",
        (28, 20),
    ),
}


def fast_path_off(model: torch.nn.Module) -> torch.nn.Module:
    """BetterTransformer's fused encoder layer fails on this torch ("Mask Type should be defined")."""
    for module in model.modules():
        if hasattr(module, "can_use_fastpath"):
            module.can_use_fastpath = False
        if hasattr(module, "BT_version"):
            module.BT_version = False
    return model.float().eval()


def padded(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors into (B, L) ids and a 0/1 mask."""
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


@torch.no_grad()
def teacher_forced(model, dataset, count: int) -> dict[str, torch.Tensor]:
    samples = [dataset[i] for i in range(count)]
    batch = dataset.collater(samples)  # sorts by source length: batch["id"] maps rows back
    logits = model(**batch["net_input"])[0].float()  # (B, T, V)
    # fp32 rounding alone moves logits of the fixture's size by ~1e-5, in fairseq as in any other implementation;
    # float64 logits let the conversion itself be checked far below that.
    logits64 = copy.deepcopy(model).double()(**batch["net_input"])[0]
    eos, pad = dataset.tgt_dict.eos(), dataset.tgt_dict.pad()
    decoder_inputs = [torch.cat([torch.tensor([eos]), sample["target"][:-1]]) for sample in samples]
    input_ids, attention_mask = padded([sample["source"] for sample in samples], pad)
    decoder_input_ids, decoder_attention_mask = padded(decoder_inputs, pad)
    out = torch.zeros(count, decoder_input_ids.shape[1], logits.shape[-1])
    out64 = out.double()
    for row, index in enumerate(batch["id"].tolist()):
        length = len(decoder_inputs[index])
        # fairseq right-pads targets too, so row `row` of its batch holds sentence `index` from position 0.
        if not torch.equal(batch["net_input"]["prev_output_tokens"][row, :length], decoder_inputs[index]):
            raise RuntimeError(f"fairseq's prev_output_tokens for sentence {index} differ from </s> + target[:-1].")
        out[index, :length] = logits[row, :length]
        out64[index, :length] = logits64[row, :length]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": decoder_attention_mask,
        "logits": out.contiguous(),
        "logits_fp64": out64.contiguous(),
    }


@torch.no_grad()
def generate(model, task, dataset, count: int, beam: int) -> dict[str, list]:
    """fairseq-generate's best hypothesis per sentence, in batches of BATCH as fairseq-generate would run them."""
    generator = task.build_generator([model], GenerationConfig(beam=beam))
    tokens: list[list[int] | None] = [None] * count
    scores: list[float | None] = [None] * count
    for start in range(0, count, BATCH):
        batch = dataset.collater([dataset[i] for i in range(start, min(start + BATCH, count))])
        for index, nbest in zip(batch["id"].tolist(), task.inference_step(generator, [model], batch), strict=True):
            tokens[index] = nbest[0]["tokens"].tolist()
            scores[index] = float(nbest[0]["score"])
    return {"tokens": tokens, "scores": scores}


def write(output: Path, checkpoint: Path, model, task, dataset, n_logits: int, n_generate: int) -> None:
    output.mkdir(parents=True, exist_ok=True)
    save_file(teacher_forced(model, dataset, n_logits), str(output / "teacher_forced.safetensors"))
    record = {
        "producer": os.path.relpath(__file__, Path(__file__).parents[2]),
        "fairseq_version": fairseq.__version__,
        "torch_version": torch.__version__,
        "checkpoint_sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
        "sentences": f"dataset indices 0..{n_generate - 1}",
        "settings": {"max_len_a": 0, "max_len_b": 200, "min_len": 1, "lenpen": 1.0, "unkpen": 0.0},
    }
    for name, beam in BEAMS.items():
        record[name] = {"beam": beam, **generate(model, task, dataset, n_generate, beam)}
    (output / "generations.json").write_text(json.dumps(record, separators=(",", ":")) + "\n")
    for path in output.iterdir():
        path.chmod(0o644)
    print(f"Wrote {output}")


def fixture_reference(fixture: Path, output: Path) -> None:
    """The fixture's test split, loaded as fairseq-generate loads it."""
    checkpoint = fixture / "checkpoint_best.pt"
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(fixture / "data-bin")}
    )
    task.load_dataset("test")
    write(output, checkpoint, fast_path_off(models[0]), task, task.dataset("test"), N_LOGITS, N_GENERATE)


def write_dictionary(path: Path, size: int) -> None:
    """A fairseq dict.txt of `size` symbols in all: the 4 specials fairseq adds, then w0, w1, ... by count."""
    path.write_text("".join(f"w{i} {1000 - i}\n" for i in range(size - 4)))


def tiny_reference(name: str, arguments: str, sizes: tuple[int, int], output: Path) -> None:
    """Build a tiny model with fairseq-train's own argument parsing, randomise it, save it with fairseq's Trainer
    (the `cfg` format), reload it as fairseq-generate would and write its outputs on random sentences."""
    output.mkdir(parents=True, exist_ok=True)
    write_dictionary(output / "dict.src.txt", sizes[0])
    write_dictionary(output / "dict.tgt.txt", sizes[1])
    flags = "--task translation --source-lang src --target-lang tgt --arch transformer --optimizer adam --lr 0.001 "
    flags += "--criterion cross_entropy --cpu --dropout 0.1 "
    line = [str(output), *flags.split(), "--save-dir", str(output), *arguments.split()]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), line))
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as fairseq-train does before every save
    trainer.save_checkpoint(str(output / "checkpoint_last.pt"), {})
    checkpoint = output / "checkpoint_last.pt"
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    lengths = torch.randint(3, 20, (2, N_LOGITS), generator=generator)

    def sentences(dictionary: Dictionary, row: int) -> list[torch.Tensor]:
        high = len(dictionary)
        return [
            torch.cat([torch.randint(dictionary.nspecial, high, (int(n),), generator=generator), torch.tensor([2])])
            for n in lengths[row]
        ]

    src, tgt = sentences(src_dict, 0), sentences(tgt_dict, 1)
    dataset = LanguagePairDataset(src, [len(s) for s in src], src_dict, tgt, [len(t) for t in tgt], tgt_dict)
    write(output, checkpoint, fast_path_off(models[0]), task, dataset, N_LOGITS, N_LOGITS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture", type=Path, help="The fixture folder (checkpoint_best.pt, data-bin/).")
    parser.add_argument("output_root", type=Path, help="Where to write fairseq_sym2math/ and fairseq_tiny_*/.")
    args = parser.parse_args()
    torch.manual_seed(0)
    fixture_reference(args.fixture, args.output_root / "fairseq_sym2math")
    for name, (arguments, sizes) in TINY_VARIANTS.items():
        tiny_reference(name, arguments, sizes, args.output_root / f"fairseq_tiny_{name}")


if __name__ == "__main__":
    main()
