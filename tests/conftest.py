"""Shared fixtures: tiny configs and models (CPU, seconds)."""

import textwrap

import pytest
import torch

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

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
