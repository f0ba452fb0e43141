"""Shared fixtures and helpers: tiny configs, models and tokenizers (CPU, seconds), the command line run in this
process, the reversal corpus, a tiny Trainer, an OPUS-MT-like Marian folder and a local fake Hub."""

import gzip
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

from conversion import marian
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.parallel_text import MULTI30K_DIR
from hf_vanilla_transformer.training.data import tokenize_pairs
from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer, VanillaSeq2SeqTrainingArguments

from .train_script import TEST_PRESET, reversal_pairs, write_corpus

VOCAB = 61
# The opening of a script run in a subprocess that must not import this package (what remote code is tested in):
# any import of it fails, and the script stops if it could still be imported.
WITHOUT_THE_PACKAGE = textwrap.dedent(
    """
    import sys
    class BlockPackage:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "hf_vanilla_transformer":
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, BlockPackage())
    try:
        import hf_vanilla_transformer
        raise SystemExit("the package is importable")
    except ImportError:
        pass
    """
)
# The code files a saved model folder carries (remote code): the config and model modules, what they import
# relatively, and the translation pipeline.
CODE_FILES = frozenset(
    {
        "configuration_vanilla_transformer.py",
        "generation_vanilla_transformer.py",
        "input_checks.py",
        "label_smoothed_loss.py",
        "modeling_vanilla_transformer.py",
        "pipeline_vanilla_translation.py",
    }
)


def tiny_config(**overrides: object) -> VanillaTransformerConfig:
    """A 2+2-layer model of width 32 with the paper's architecture (post-LN, sinusoids, 3-way tying)."""
    fields: dict = dict(vocab_size=VOCAB, max_position_embeddings=64, dropout=0.0)
    fields.update(overrides)
    return VanillaTransformerConfig.from_paper(N=2, d_model=32, d_ff=64, h=4, **fields)


def tiny_model(seed: int = 0, **overrides: object) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def random_batch(batch: int = 3, src_len: int = 9, tgt_len: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded source rows of different lengths (ids 4.. avoid the special tokens) and target ids."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (batch, src_len), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch):
        length = max(2, src_len - 2 * row)
        input_ids[row, length:] = 1
        attention_mask[row, length:] = 0
    input_ids[:, 0] = torch.randint(4, VOCAB, (batch,), generator=gen)
    labels = torch.randint(4, VOCAB, (batch, tgt_len), generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.fixture
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()


def tiny_tokenizer():
    """A word-level tokenizer over "w4" ... "w60" with the model's special ids, appending </s> like the real one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": i for i in range(4, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """A local fake Hub (tests/fake_hub.py) that huggingface_hub and transformers talk to in this process:
    its URL as the endpoint, a token in HF_TOKEN, an empty download cache, not offline. Yields (URL, state)."""
    from huggingface_hub import constants, hf_api
    from transformers.utils import hub as transformers_hub

    from .fake_hub import fake_hub

    with fake_hub() as (url, state):
        # huggingface_hub reads HF_ENDPOINT at import: the constants, and the module-level HfApi that
        # huggingface_hub.create_repo & co. (transformers' push_to_hub) are bound to.
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(hf_api.api, "endpoint", url)
        # transformers keeps one HfApi of its own, made on first use: made again, it takes the fake's URL.
        monkeypatch.setattr(transformers_hub, "_hf_api", None)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hub-cache")))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_TOKEN", "fake-token")
        yield url, state


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A tiny untrained model with a byte-level BPE (which keeps "\r" as a token, as the real tokenizer does)."""
    import gzip

    from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config
    from hf_vanilla_transformer.training.data import MULTI30K_DIR
    from hf_vanilla_transformer.training.tokenization import special_token_ids, train_bpe_tokenizer

    with gzip.open(MULTI30K_DIR / "train.en.gz", "rt", encoding="utf-8") as handle:
        lines = [next(handle).strip() for _ in range(200)]
    tokenizer = train_bpe_tokenizer(lines, vocab_size=300)
    model = tiny_model(vocab_size=len(tokenizer), **special_token_ids(tokenizer))
    model.generation_config = paper_generation_config(model.config)
    folder = tmp_path_factory.mktemp("bpe") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`hf-vanilla-transformer ARGV` in this process: exit status, stdout, stderr."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`run` with the preset `transformer-test` (train_script.TEST_PRESET) registered, and stderr less blank lines
    and progress bars (lines ending in "/s]", as `datasets`' "examples/s]")."""
    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)
    code, out, err = run(argv, capsys)
    lines = err.replace("\r", "\n").splitlines()
    return code, out, "\n".join(line for line in lines if line.strip() and not line.endswith("/s]"))


def run_script(
    script: str, tmp_path: Path, *args: str, package: bool, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter (-P: not the current folder on the path) in `tmp_path`, offline unless `env`
    (the whole environment) is given; without the package, behind WITHOUT_THE_PACKAGE."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    code = script if package else WITHOUT_THE_PACKAGE + script
    return subprocess.run(
        [sys.executable, "-P", "-c", code, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_multi30k_sample(folder: Path, pairs: int, test_pairs: int) -> Path:
    """The first `pairs` bundled Multi30k EN-DE training pairs as `folder`/train.en and train.de, and their first
    `test_pairs` as test.en and test.de (plain text); returns `folder`."""
    for lang in ("en", "de"):
        with gzip.open(MULTI30K_DIR / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(pairs)]
        (folder / f"train.{lang}").write_text("".join(lines), encoding="utf-8")
        (folder / f"test.{lang}").write_text("".join(lines[:test_pairs]), encoding="utf-8")
    return folder


def one_line_error(code: int, err: str, *parts: str) -> None:
    """A command's refusal: exit status 2 and one line of stderr, no traceback, naming each of `parts`."""
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reversal corpus of tests/train_script.py (`write_corpus`), one per test module."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def tiny_setup(n: int = 96, model_seed: int = 0) -> tuple:
    """96 reversal pairs (always the same) and a 1+1-layer model initialised from `model_seed`."""
    tokenizer = tiny_tokenizer()
    sources, targets = reversal_pairs(n)
    dataset = tokenize_pairs(Dataset.from_dict({"source": sources, "target": targets}), tokenizer)
    torch.manual_seed(model_seed)
    config = VanillaTransformerConfig.from_paper(
        N=1, d_model=16, d_ff=32, h=2, P_drop=0.0, vocab_size=len(tokenizer), max_position_embeddings=32
    )
    return tokenizer, dataset, VanillaTransformerForConditionalGeneration(config)


def make_trainer(tmp_path, model, tokenizer, dataset, **overrides) -> VanillaSeq2SeqTrainer:
    """A Trainer on the CPU with 64-token batches, inverse-sqrt schedule and no checkpoints; `overrides` replace any
    of its arguments."""
    options = dict(
        output_dir=str(tmp_path),
        max_tokens=64,
        lr_schedule="inverse_sqrt",
        learning_rate=1e-3,
        warmup_steps=4,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        logging_steps=2,
    )
    options.update(overrides)
    args = VanillaSeq2SeqTrainingArguments(**options)
    return VanillaSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


# OPUS-MT-like Marian models (the Marian import and fine-tuning from an imported folder)
ATOL = 1e-5
TEXT = ["the cat sat on the mat", "a dog ate the bone", "the bird sang a song", "cats and dogs are friends"]
TEXT += ["the sun is hot today"]


def import_args(source: Path, output: Path) -> marian.MarianOptions:
    """The import's options, with the bound these tiny models meet in both precisions."""
    return marian.MarianOptions(source, output, atol=ATOL, atol_fp32=ATOL)


def tiny_marian_config(**overrides: object) -> MarianConfig:
    fields: dict = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1,
        max_position_embeddings=64,
    )
    return MarianConfig(**fields | overrides)


@pytest.fixture(scope="module")
def opus_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OPUS-MT-like MarianMTModel folder with a MarianTokenizer (SentencePiece)."""
    import sentencepiece

    folder = tmp_path_factory.mktemp("opus")
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT * 4),
        model_writer=proto,
        vocab_size=30,
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(proto.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto.getvalue())
    pieces = [processor.id_to_piece(i) for i in range(1, processor.get_piece_size())]  # 0 is <unk>
    vocab = {"</s>": 0, "<unk>": 1} | {piece: i + 2 for i, piece in enumerate(pieces)}
    vocab["<pad>"] = len(vocab)  # OPUS-MT: <pad> is the last id and starts the decoder
    (folder / "vocab.json").write_text(json.dumps(vocab))
    files = [str(folder / name) for name in ("source.spm", "target.spm", "vocab.json")]
    MarianTokenizer(*files).save_pretrained(folder)  # writes tokenizer_config.json as OPUS-MT folders have it
    size = len(vocab)
    config = tiny_marian_config(
        vocab_size=size,
        encoder_layers=2,
        decoder_layers=2,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=size - 1,
        decoder_start_token_id=size - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        init_std=0.2,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    model.final_logits_bias.normal_()
    model.generation_config.bad_words_ids = [[size - 1]]
    model.save_pretrained(folder)
    return folder
