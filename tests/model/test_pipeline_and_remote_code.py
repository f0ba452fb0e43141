"""pipeline("translation") with the package imported, and the saved folder as remote code where it is not."""

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from ..conftest import run_script, tiny_model, tiny_tokenizer

SENTENCES = ["w5 w6 w7 w8", "w9 w10", "w11 w12 w13 w14 w15 w16"]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    tiny_model(seed=3).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def reference_translations(directory: Path, **generate_kwargs: object) -> list[str]:
    model = tiny_model(seed=3)
    tokenizer = tiny_tokenizer()
    outputs = []
    for text in SENTENCES:
        ids = model.generate(**tokenizer(text, return_tensors="pt"), **generate_kwargs)
        outputs.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    return outputs


@pytest.mark.parametrize("task", ["translation", "translation_en_to_de"])
def test_translation_pipeline_with_the_package(saved_dir: Path, task: str) -> None:
    translator = pipeline(task, model=str(saved_dir))
    expected = reference_translations(saved_dir, max_new_tokens=7)
    single = translator(SENTENCES[0], max_new_tokens=7)
    assert single == [{"translation_text": expected[0]}]
    batched = translator(SENTENCES, batch_size=2, max_new_tokens=7)
    assert batched == [{"translation_text": text} for text in expected]
    if task != "translation":
        assert (translator.src_lang, translator.tgt_lang) == ("en", "de")


def test_pipeline_generation_parameters(saved_dir: Path) -> None:
    translator = pipeline("translation", model=str(saved_dir))
    short = translator(SENTENCES[2], max_new_tokens=2)[0]["translation_text"]
    assert len(short.split()) <= 2
    several = translator(SENTENCES, num_beams=3, num_return_sequences=2, max_new_tokens=5)
    assert len(several) == 3 and all(len(item) == 2 for item in several)
    beams = reference_translations(saved_dir, num_beams=3, max_new_tokens=5)
    assert [item[0]["translation_text"] for item in several] == beams


REMOTE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
    directory, sentences, out_file = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    model = AutoModelForSeq2SeqLM.from_pretrained(directory, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    generated = model.generate(**batch, num_beams=3, max_new_tokens=6)
    translator = pipeline("translation", model=directory, trust_remote_code=True)
    pair = pipeline("translation_en_to_de", model=directory, trust_remote_code=True)
    json.dump(obj={
        "module": type(model).__module__,
        "logits": model(**batch, decoder_input_ids=batch["input_ids"]).logits.tolist(),
        "beam": generated.tolist(),
        "pipeline": translator(sentences, max_new_tokens=7),
        "pipeline_pair": pair(sentences[0], max_new_tokens=7),
    }, fp=open(out_file, "w"))
    """
)


def test_remote_code_in_a_process_without_the_package(saved_dir: Path, tmp_path: Path) -> None:
    result = run_script(
        REMOTE_SCRIPT, tmp_path, str(saved_dir), json.dumps(SENTENCES), str(tmp_path / "out.json"), package=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads((tmp_path / "out.json").read_text())
    assert remote["module"].startswith("transformers_modules")
    model, tokenizer = tiny_model(seed=3), tiny_tokenizer()
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    logits = model(**batch, decoder_input_ids=batch["input_ids"]).logits
    torch.testing.assert_close(torch.tensor(remote["logits"]), logits, atol=0, rtol=0)
    assert remote["beam"] == model.generate(**batch, num_beams=3, max_new_tokens=6).tolist()
    expected = reference_translations(saved_dir, max_new_tokens=7)
    assert remote["pipeline"] == [{"translation_text": text} for text in expected]
    assert remote["pipeline_pair"] == [{"translation_text": expected[0]}]


OTHER_MODEL_SCRIPT = textwrap.dedent(
    """
    import sys
    from transformers import pipeline
    if sys.argv[2] == "with":
        import hf_vanilla_transformer  # noqa: F401
    try:
        translator = pipeline(sys.argv[3], model=sys.argv[1])
        print("OUTPUT", translator("w5 w6 w7", max_new_tokens=3))
    except Exception as error:
        print("ERROR", type(error).__name__, error)
    """
)


@pytest.mark.parametrize(
    ("architecture", "task"),
    [
        *itertools.product(["marian", "m2m_100"], ["translation", "translation_en_to_de"]),
        ("nllb", "translation"),  # the task's two forms take one path, tested above: one each here
        ("mbart", "translation_en_to_de"),
    ],
)
def test_the_translation_pipeline_leaves_other_models_as_transformers_does(tmp_path, architecture, task) -> None:
    """Importing the package must not hand NLLB/M2M100/mBART/Marian models a pipeline that ignores their language
    settings: for them `pipeline("translation")` does exactly what transformers 5 does without the package. NLLB is
    an M2M100 model with NLLB's tokenizer (language codes such as eng_Latn), mBART its own model and tokenizer
    (en_XX); both tokenizers are built here, with their language codes and no vocabulary beyond them."""
    from transformers import (
        M2M100Config,
        M2M100ForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        MBartConfig,
        MBartForConditionalGeneration,
        MBartTokenizer,
        NllbTokenizer,
    )

    sizes = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    sizes |= dict(encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    tokenizer = {
        "nllb": lambda: NllbTokenizer(src_lang="eng_Latn", tgt_lang="deu_Latn"),
        "mbart": lambda: MBartTokenizer(src_lang="en_XX", tgt_lang="de_DE"),
    }.get(architecture, tiny_tokenizer)()
    vocab_size = max(64, len(tokenizer))
    if architecture == "marian":
        model = MarianMTModel(MarianConfig(vocab_size=vocab_size, **sizes))
    elif architecture == "mbart":
        model = MBartForConditionalGeneration(MBartConfig(vocab_size=vocab_size, **sizes))
    else:
        model = M2M100ForConditionalGeneration(M2M100Config(vocab_size=vocab_size, **sizes))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    outcomes = []
    for imported in ("without", "with"):
        run = subprocess.run(
            [sys.executable, "-c", OTHER_MODEL_SCRIPT, str(tmp_path), imported, task],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        lines = [line for line in run.stdout.splitlines() if line.startswith(("OUTPUT", "ERROR"))]
        assert run.returncode == 0 and len(lines) == 1, run.stdout + run.stderr
        outcomes.append(lines[0])
    assert outcomes[0].startswith("ERROR KeyError") and "has been removed from transformers" in outcomes[0]
    assert outcomes[1] == outcomes[0]
