"""Helpers of the Marian export tests: our logits, CTranslate2 on an exported folder, and the two compared."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration

if TYPE_CHECKING:
    import ctranslate2


def logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**inputs).logits


def ctranslate2_translator(marian_folder: Path, output: Path) -> ctranslate2.Translator:
    import ctranslate2  # a dev dependency: these tests must fail, not skip, where it is missing

    ctranslate2.converters.TransformersConverter(str(marian_folder)).convert(str(output))
    return ctranslate2.Translator(str(output), device="cpu", intra_threads=1)


def greedy_tokens(
    model: VanillaTransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, sources: list[str]
) -> list[list[str]]:
    """Our greedy decoding as token strings, without the start token, EOS and padding. <pad> is suppressed because
    CTranslate2's MarianMTLoader removes it from the vocabulary."""
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    output = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=12, suppress_tokens=[pad])
    return [tokenizer.convert_ids_to_tokens([i for i in row[1:].tolist() if i not in (pad, eos)]) for row in output]


def log_prob_difference(
    translator: ctranslate2.Translator,
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    targets: list[list[str]],
) -> float:
    """Max-abs difference between CTranslate2's `score_batch` log-probabilities of `targets` + EOS and ours,
    normalised without <pad> as in CTranslate2."""
    source_tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in sources]
    difference = 0.0
    for source, target, scored in zip(sources, targets, translator.score_batch(source_tokens, targets), strict=True):
        ids = tokenizer.convert_tokens_to_ids(target)
        inputs = {
            "input_ids": tokenizer(source, return_tensors="pt").input_ids,
            "decoder_input_ids": torch.tensor([[model.config.decoder_start_token_id, *ids]]),
        }
        scores = logits(model, inputs)[0]
        scores[:, model.config.pad_token_id] = -torch.inf
        labels = torch.tensor([*ids, model.config.eos_token_id])
        ours = scores.log_softmax(-1)[torch.arange(len(labels)), labels]
        difference = max(difference, (torch.tensor(scored.log_probs) - ours).abs().max().item())
    return difference
