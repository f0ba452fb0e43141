"""Marian / OPUS-MT import, export to MarianMTModel, and CTranslate2 on the export (conversion/marian.py).

Tiny random models only, no network: an OPUS-MT-like folder is built in tests/conftest.py (a SentencePiece model
trained on a few lines, Marian's vocab.json with </s> = 0 and <pad> last, swish, a non-zero final_logits_bias).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoTokenizer,
    MarianMTModel,
    PreTrainedTokenizerFast,
)

from conversion import marian
from conversion.__main__ import main
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.cli import main as main_cli
from hf_vanilla_transformer.files import MANIFEST
from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config

from ..conftest import ATOL, TEXT, VOCAB, import_args, tiny_marian_config, tiny_model, tiny_tokenizer
from .conftest import ctranslate2_translator, greedy_tokens, log_prob_difference, logits

SOURCES = ["w5 w9 w33 w12", "w40 w41", "w7 w8 w9 w10 w11 w12 w13"]


def export_args(source: Path, output: Path, **flags: bool) -> marian.ToMarianOptions:
    """The export's options: `flags` are keep_token_ids and allow_nonzero_start_embedding."""
    return marian.ToMarianOptions(source, output, atol=ATOL, atol_fp32=ATOL, **flags)


def save_ours(model: VanillaTransformerForConditionalGeneration, folder: Path, tokenizer: bool = True) -> Path:
    model.save_pretrained(folder)
    if tokenizer:
        tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matrices: one thread is faster than contended ones on shared CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_import_opus_mt_folder(opus_folder: Path, tmp_path: Path) -> None:
    ours = marian.convert(import_args(opus_folder, tmp_path)).model
    config = ours.config
    assert (config.sinusoidal_layout, config.lm_head_bias, config.activation_function) == ("concat", True, "swish")
    assert (config.pad_token_id, config.eos_token_id) == (config.vocab_size - 1, 0)
    assert config.decoder_start_token_id == config.pad_token_id
    reference = MarianMTModel.from_pretrained(opus_folder)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    inputs = marian.sample_inputs(config, seed=1)
    difference = (logits(reference, inputs) - logits(reloaded, inputs)).abs().max().item()
    print(f"MarianMTModel vs imported model from disk: max-abs {difference:.2e}")
    assert difference <= ATOL
    # Tokenizer files are copied as they are; MarianTokenizer (sentencepiece) loads them from our folder.
    source, copied = AutoTokenizer.from_pretrained(opus_folder), AutoTokenizer.from_pretrained(tmp_path)
    assert type(copied).__name__ == "MarianTokenizer"
    assert copied(TEXT).input_ids == source(TEXT).input_ids
    assert reloaded.generation_config.bad_words_ids == [[config.pad_token_id]]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [({"encoder_layerdrop": 0.1}, "encoder_layerdrop"), ({"activation_function": "quick_gelu"}, "activation")],
)
def test_import_refuses_what_ours_cannot_represent(overrides: dict, named: str) -> None:
    with pytest.raises(NotImplementedError, match=named):
        marian.vanilla_config_from_marian(tiny_marian_config(**overrides))


def test_import_refuses_to_merge_weights_that_differ() -> None:
    """Marian with shared but untied embeddings keeps three copies; ours shares one, so they must agree."""
    source = MarianMTModel(tiny_marian_config(tie_word_embeddings=False))
    with torch.no_grad():
        source.model.encoder.embed_tokens.weight[5] += 1.0
    with pytest.raises(ValueError, match=r"embed_tokens\.weight` both map to `model\.shared\.weight"):
        marian.marian_to_vanilla(source)


def test_import_refuses_other_architectures(tmp_path: Path) -> None:
    save_ours(tiny_model(), tmp_path, tokenizer=False)
    with pytest.raises(ValueError, match="not a Marian"):
        marian.load_marian(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "keep_token_ids"),
    [
        ({}, False),
        ({"sinusoidal_layout": "concat", "lm_head_bias": True}, True),
        ({"tie_word_embeddings": False, "activation_function": "gelu"}, False),
        ({"share_encoder_decoder_embeddings": False, "decoder_vocab_size": VOCAB + 5}, True),
    ],
    ids=["paper-pad-last", "concat-bias-same-ids", "untied-head-pad-last", "separate-vocabularies-same-ids"],
)
def test_export_and_round_trip(overrides: dict, keep_token_ids: bool, tmp_path: Path) -> None:
    model = tiny_model(seed=3, init_std=0.2, **overrides)
    if model.config.lm_head_bias:
        torch.nn.init.normal_(model.lm_head.bias)
    save_ours(model, tmp_path / "ours")
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian", keep_token_ids=keep_token_ids))
    exported = MarianMTModel.from_pretrained(tmp_path / "marian")
    size = max(VOCAB, model.config.decoder_vocab_size)
    new_id = torch.arange(size) if keep_token_ids else marian.pad_last_order(VOCAB, 1).argsort()  # ours -> Marian
    assert exported.config.pad_token_id == exported.config.decoder_start_token_id == int(new_id[1])

    inputs = marian.sample_inputs(model.config, seed=2)
    mapped = {**inputs, **{key: new_id[inputs[key]] for key in ("input_ids", "decoder_input_ids")}}
    expected = logits(model, inputs)
    columns = new_id[: expected.shape[-1]]
    difference = (expected - logits(exported, mapped)[..., columns]).abs().max().item()
    print(f"ours vs exported MarianMTModel: max-abs {difference:.2e}")
    assert difference <= ATOL

    back = marian.convert(import_args(tmp_path / "marian", tmp_path / "back")).model
    difference = (expected - logits(back, mapped)[..., columns]).abs().max().item()
    print(f"ours vs ours -> Marian -> ours: max-abs {difference:.2e}")
    assert difference <= ATOL
    source_tokenizer, exported_tokenizer = tiny_tokenizer(), AutoTokenizer.from_pretrained(tmp_path / "marian")
    assert exported_tokenizer(SOURCES).input_ids == [
        new_id[ids].tolist() for ids in source_tokenizer(SOURCES).input_ids
    ]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"normalize_before": True}, "normalize_before"),
        ({"add_final_layer_norm": True}, "add_final_layer_norm"),
        ({"position_embedding_type": "learned"}, "position_embedding_type"),
        ({"sinusoidal_layout": "fairseq"}, "fairseq"),
        ({"position_offset": 2}, "position_offset"),
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps"),
    ],
)
def test_export_refuses_what_marian_cannot_represent(overrides: dict, named: str) -> None:
    with pytest.raises(NotImplementedError, match=named):
        marian.vanilla_to_marian(tiny_model(**overrides))


def test_pad_moves_only_within_one_vocabulary() -> None:
    model = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=VOCAB + 5)
    with pytest.raises(NotImplementedError, match="one vocabulary"):
        marian.vanilla_to_marian(model, move_pad_last=True)


def test_export_refuses_nonzero_start_embedding(tmp_path: Path) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.model.shared.weight[model.config.decoder_start_token_id].normal_()
    save_ours(model, tmp_path / "ours")
    with pytest.raises(ValueError, match="non-zero embedding"):
        marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian", allow_nonzero_start_embedding=True))


def test_export_without_tokenizer_needs_keep_token_ids(tmp_path: Path) -> None:
    save_ours(tiny_model(), tmp_path / "ours", tokenizer=False)
    with pytest.raises(ValueError, match="no tokenizer"):
        marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian", keep_token_ids=True))
    assert not (tmp_path / "marian" / "tokenizer.json").exists()


def test_exported_marian_generates_long_sentences_like_ours(tmp_path: Path) -> None:
    """The export carries a length limit: a plain `MarianMTModel.generate()` reproduces our greedy tokens past
    transformers' default of 20, up to our own limit (source length + 50, where ours forces EOS)."""
    model = tiny_model(seed=1, init_std=0.2, lm_head_bias=True)
    with torch.no_grad():
        model.lm_head.bias[2] = -30.0  # EOS never wins: outputs run to the limit
    model.generation_config = paper_generation_config(model.config)
    save_ours(model, tmp_path / "ours")
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    generation = json.loads((tmp_path / "marian" / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["max_length"]) == (4, 0.6, 64)
    assert "max_new_tokens" not in generation and "length_penalty_type" not in generation

    batch = tiny_tokenizer()(SOURCES, return_tensors="pt", padding=True)
    ours = model.generate(**batch, num_beams=1)
    new_id = marian.pad_last_order(VOCAB, 1).argsort()  # ours -> Marian
    exported = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    theirs = exported.generate(input_ids=new_id[batch.input_ids], attention_mask=batch.attention_mask, num_beams=1)
    for row, sequence in enumerate(ours.tolist()):
        generated = sequence[1 : sequence.index(2)]  # up to our EOS, forced at source length + 50
        assert len(generated) == int(batch.attention_mask[row].sum()) + 49 > 20
        assert theirs[row, 1 : 1 + len(generated)].tolist() == new_id[generated].tolist(), row


def test_exported_card_says_what_of_section_6_1_is_lost(tmp_path: Path) -> None:
    model = tiny_model()
    model.generation_config = paper_generation_config(model.config)
    save_ours(model, tmp_path / "ours")
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    card = " ".join((tmp_path / "marian" / "README.md").read_text().split())
    assert "Of §6.1's decoding it cannot express: GNMT's length penalty ((5 + |Y|) / 6)^α becomes" in card
    assert "the per-sentence limit (source length + 50, EOS forced there) becomes the fixed `max_length` 64" in card
    assert "CTranslate2 reads no generation config" in card and "no limit relative to the source length" in card


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m conversion to-marian SRC OUT` and `python -m conversion marian SRC OUT`; refusals exit 2."""
    save_ours(tiny_model(), tmp_path / "ours")
    assert main(["to-marian", str(tmp_path / "ours"), str(tmp_path / "marian")]) == 0
    assert main(["marian", str(tmp_path / "marian"), str(tmp_path / "back")]) == 0
    assert "<pad> moved from 1 to 60" in (tmp_path / "marian" / "README.md").read_text()
    assert (tmp_path / "back" / "README.md").is_file()
    save_ours(tiny_model(normalize_before=True), tmp_path / "pre-ln")
    with pytest.raises(SystemExit) as exit_info:
        main(["to-marian", str(tmp_path / "pre-ln"), str(tmp_path / "refused")])
    assert exit_info.value.code == 2
    assert "normalize_before=True" in capsys.readouterr().err


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4, "b": 5, "ab": 6, "c": 7}
    tokenizer = Tokenizer(models.BPE(vocab, [("a", "b")], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def unigram_tokenizer() -> PreTrainedTokenizerFast:
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("a", -1.0), ("b", -1.5), ("ab", -0.5)]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("make_tokenizer", [bpe_tokenizer, unigram_tokenizer], ids=["bpe", "unigram"])
def test_tokenizer_follows_pad_to_the_last_id(
    make_tokenizer: Callable[[], PreTrainedTokenizerFast], tmp_path: Path
) -> None:
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(tmp_path / "before")
    (tmp_path / "after").mkdir()
    new_id = marian.pad_last_order(len(tokenizer), 1).argsort()
    marian.write_tokenizer(tmp_path / "before", tmp_path / "after", new_id)  # checks every id itself
    after = AutoTokenizer.from_pretrained(tmp_path / "after")
    assert after.pad_token_id == len(tokenizer) - 1
    assert after("ab b a").input_ids == new_id[tokenizer("ab b a").input_ids].tolist()


# ------------------------------------------------------------------------------------------------------ CTranslate2
@pytest.mark.parametrize(("seed", "activation"), [(1, "relu"), (2, "swish"), (1, "gelu")])
def test_ctranslate2_decodes_like_ours(seed: int, activation: str, tmp_path: Path) -> None:
    model = tiny_model(seed=seed, init_std=0.2, activation_function=activation)  # 0.2: outputs depend on the source
    assert marian.start_embedding_max(model) == 0.0  # padding_idx row, zero at init
    save_ours(model, tmp_path / "ours")
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    translator = ctranslate2_translator(tmp_path / "marian", tmp_path / "ct2")
    tokenizer = tiny_tokenizer()
    source_tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in SOURCES]
    results = translator.translate_batch(source_tokens, beam_size=1, max_decoding_length=12)
    ours = greedy_tokens(model, tokenizer, SOURCES)
    assert [result.hypotheses[0] for result in results] == ours
    assert len({tuple(tokens) for tokens in ours}) > 1, "a degenerate model: the test would prove little"
    difference = log_prob_difference(translator, model, tokenizer, SOURCES, ours)
    print(f"CTranslate2 vs ours: max-abs log-prob difference {difference:.2e}")
    assert difference <= 1e-4


def test_ctranslate2_starts_from_zero_not_from_the_start_embedding(tmp_path: Path) -> None:
    """The caveat the exporter guards against: with a non-zero start row, CTranslate2 scores differ from ours."""
    model = tiny_model(seed=1, init_std=0.2)
    with torch.no_grad():
        model.model.shared.weight[model.config.decoder_start_token_id].normal_(std=0.3)
    save_ours(model, tmp_path / "ours")
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian", allow_nonzero_start_embedding=True))
    translator = ctranslate2_translator(tmp_path / "marian", tmp_path / "ct2")
    targets = [["w4", "w5"]] * len(SOURCES)
    difference = log_prob_difference(translator, model, tiny_tokenizer(), SOURCES, targets)
    print(f"non-zero start embedding: CTranslate2 vs ours max-abs log-prob difference {difference:.2e}")
    assert difference > 1e-2


def test_ctranslate2_reads_an_imported_opus_model_exported_back(opus_folder: Path, tmp_path: Path) -> None:
    """The MarianTokenizer (sentencepiece) route: OPUS-MT -> ours -> Marian -> CTranslate2, <pad> already last."""
    ours = marian.convert(import_args(opus_folder, tmp_path / "ours")).model
    ours.generation_config.forced_eos_token_id = None  # OPUS-MT forces EOS at the length limit, CTranslate2 does not
    marian.export(export_args(tmp_path / "ours", tmp_path / "marian"))
    translator = ctranslate2_translator(tmp_path / "marian", tmp_path / "ct2")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "marian")
    source_tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in TEXT]
    results = translator.translate_batch(source_tokens, beam_size=1, max_decoding_length=12)
    assert [result.hypotheses[0] for result in results] == greedy_tokens(ours, tokenizer, TEXT)


def test_imported_opus_folder_pushes_every_tokenizer_file(
    opus_folder: Path, tmp_path: Path, hub, capsys: pytest.CaptureFixture[str]
) -> None:
    """`push` of a folder imported from OPUS-MT (fake Hub, tests/fake_hub.py): every file of the folder is uploaded,
    the SentencePiece models and vocabulary included, and the tokenizer loaded from the repository tokenizes as
    the source's."""
    _, state = hub
    output = tmp_path / "imported"
    marian.convert(import_args(opus_folder, output))
    assert main_cli(["push", str(output), "me/opus-imported"]) == 0, capsys.readouterr().err
    ((_, _, added, _),) = state.commits
    written = {path.relative_to(output).as_posix() for path in output.rglob("*") if path.is_file()}
    assert set(added) == written - {MANIFEST}  # the package's manifest stays local
    assert {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json"} <= set(added)
    downloaded = AutoTokenizer.from_pretrained("me/opus-imported")
    assert downloaded(TEXT).input_ids == AutoTokenizer.from_pretrained(opus_folder)(TEXT).input_ids
    # The uploaded card's examples load the repository, not the local folder the converter wrote.
    card = state.files("me/opus-imported")["README.md"].decode()
    loads = re.findall(r'from_pretrained\("([^"]*)"', card)
    assert loads and set(loads) == {"me/opus-imported"}, loads
    assert str(output) in (output / "README.md").read_text()
