"""A model trained here -> `to-marian` (no force flag) -> CTranslate2 decodes like ours (start_embedding.py).

The real training path (`training.train.train`, the trainer, checkpoint averaging) on the tests' reversal corpus for a
dozen updates of the 1+1-layer test preset; then the exporter's command line and CTranslate2's converter. The
"train" runs show what the default prevents: the trained start row, the exporter's refusal and CTranslate2's
different scores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from conversion.__main__ import main
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.start_embedding import start_embedding_max
from hf_vanilla_transformer.training.train import train

from ..train_script import MAX_TOKENS, TEST_PRESET, write_corpus
from .conftest import ctranslate2_translator, greedy_tokens, log_prob_difference

UPDATES = 12


def train_tiny(folder: Path, decoder_start_embedding: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model folder trained for UPDATES updates; returns the folder."""
    # init_std 0.2: a dozen updates leave a model whose outputs still depend on the source (the reversal is not
    # learned that soon), so that equal tokens say something.
    monkeypatch.setitem(PRESETS, "transformer-test", {**TEST_PRESET, "init_std": 0.2})
    corpus = write_corpus(folder / "corpus")
    options = TrainOptions(
        output_dir=folder / "run",
        train_src=corpus / "train.src",
        train_tgt=corpus / "train.tgt",
        tokenizer=corpus / "tokenizer",
        preset="transformer-test",
        dropout=0.0,
        schedule="inverse_sqrt",
        lr=1e-3,
        warmup_steps=5,
        max_tokens=MAX_TOKENS,
        max_time=None,
        max_steps=UPDATES,
        average_last=2,
        evaluate=False,
        progress=False,
        bf16="no",
        decoder_start_embedding=decoder_start_embedding,
    )
    return train(options).model_dir


def sources(folder: Path) -> list[str]:
    return (folder / "corpus" / "train.src").read_text().splitlines()[:24]


def test_a_trained_model_exports_to_ctranslate2_and_decodes_like_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = train_tiny(tmp_path, "zero", monkeypatch)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    assert start_embedding_max(model) == 0.0
    rows = model.model.shared.weight.abs().amax(-1)
    assert (rows > 0).sum() == len(rows) - 1, "only the start row is zero"
    assert main(["to-marian", str(model_dir), str(tmp_path / "marian")]) == 0  # no force flag
    translator = ctranslate2_translator(tmp_path / "marian", tmp_path / "ct2")

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = sources(tmp_path)
    ours = greedy_tokens(model, tokenizer, texts)
    source_tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in texts]
    results = translator.translate_batch(source_tokens, beam_size=1, max_decoding_length=12, min_decoding_length=0)
    assert [result.hypotheses[0] for result in results] == ours
    assert len({tuple(tokens) for tokens in ours}) > 1, "a degenerate model: the test would prove little"
    difference = log_prob_difference(translator, model, tokenizer, texts, ours)
    print(f"trained model, CTranslate2 vs ours: max-abs log-prob difference {difference:.2e}")
    assert difference <= 1e-4


def test_without_the_zero_row_the_export_is_refused_and_ctranslate2_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = train_tiny(tmp_path, "train", monkeypatch)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    assert start_embedding_max(model) > 1e-3  # the tied projection trained it (label smoothing reaches <pad>)
    with pytest.raises(SystemExit) as exit_info:
        main(["to-marian", str(model_dir), str(tmp_path / "refused")])
    assert exit_info.value.code == 2 and "non-zero embedding" in capsys.readouterr().err

    args = ["to-marian", str(model_dir), str(tmp_path / "marian"), "--allow-nonzero-start-embedding"]
    assert main(args) == 0
    translator = ctranslate2_translator(tmp_path / "marian", tmp_path / "ct2")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = sources(tmp_path)
    difference = log_prob_difference(translator, model, tokenizer, texts, greedy_tokens(model, tokenizer, texts))
    print(f"start row trained: CTranslate2 vs ours max-abs log-prob difference {difference:.2e}")
    assert difference > 1e-2


def test_the_option_is_checked(tmp_path: Path) -> None:
    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainingArguments

    with pytest.raises(ValueError, match="`decoder_start_embedding` must be one of"):
        VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path), decoder_start_embedding="frozen")


def test_the_start_token_must_be_pad() -> None:
    """Zeroing the row of a token that is also a label (here </s>) would fix its logit: refused."""
    from hf_vanilla_transformer.training.start_embedding import ZeroStartEmbeddingCallback

    from ..conftest import tiny_model

    with pytest.raises(ValueError, match="needs decoder_start_token_id == pad_token_id"):
        ZeroStartEmbeddingCallback(tiny_model(decoder_start_token_id=2))


def test_the_row_and_its_adam_state_stay_zero_with_weight_decay(tmp_path: Path) -> None:
    """Label smoothing reaches <pad> through the tied projection, weight decay multiplies the row: neither moves
    it, and Adam's moments for it stay zero."""
    from ..conftest import make_trainer, tiny_setup

    tokenizer, dataset, model = tiny_setup()
    with torch.no_grad():
        model.model.shared.weight[model.config.pad_token_id].normal_()  # as a model trained without the option
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_steps=6, weight_decay=0.1)
    trainer.train()
    weight = model.model.shared.weight
    assert model.lm_head.weight is weight
    assert start_embedding_max(model) == 0.0
    state = trainer.optimizer.state[weight]
    assert state["exp_avg"][model.config.pad_token_id].abs().max() == 0
    assert state["exp_avg_sq"][model.config.pad_token_id].abs().max() == 0
