"""The model side of the server: `ServingModel` decodes a batch of sources with one `generate()` call (through the
library's `Translator`, with a request's `TranslateOptions`) and computes the cross-attention of one layer and head for
the page. Every method that touches the model runs on the batcher's one worker thread; `token_counts` uses a
tokenizer of its own, so that it can run on the server's event loop meanwhile."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..inference.attention_maps import attention_maps
from ..inference.translation import TranslateOptions, Translation, Translator


class ServingModel:
    """A loaded model and its tokenizer, for the server. `bf16`: decode under bf16 autocast (as `translate --bf16`)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, bf16: bool = False) -> None:
        self.model, self.tokenizer, self.bf16 = model.eval(), tokenizer, bf16
        # Tokenizers keep padding/truncation state that a call sets: a call on the event loop while the worker
        # pads a batch would race ("Already borrowed"), so counting has its own copy.
        self.counting_tokenizer = copy.deepcopy(tokenizer)

    @property
    def default_beams(self) -> int:
        return self.model.generation_config.num_beams or 1

    @property
    def decoder_layers(self) -> int:
        return self.model.config.decoder_layers

    @property
    def decoder_heads(self) -> int:
        return self.model.config.decoder_attention_heads

    def input_limit(self, max_input_tokens: int | None) -> int:
        """The source tokens a sentence keeps: `max_input_tokens`, else the tokenizer's limit."""
        if max_input_tokens is not None:
            return max_input_tokens
        return min(self.tokenizer.model_max_length, 2**31 - 1)  # no limit saved: 1e30

    def token_counts(self, sources: list[str], max_input_tokens: int | None) -> list[int]:
        """Source tokens of each sentence as the model sees it (cut to the limit), for the batch budget."""
        limit = self.input_limit(max_input_tokens)
        return [min(len(ids), limit) for ids in self.counting_tokenizer(sources)["input_ids"]]

    def decode(self, options: TranslateOptions, prefix: str | None, sources: list[str]) -> list[list[Translation]]:
        """The outputs of each source (`options`' decoding; every translation starting with `prefix`), from one
        `generate()` call: the batch is `sources`, whatever `options.batch_size`."""
        translator = Translator(self.model, self.tokenizer, dataclasses.replace(options, batch_size=len(sources)))
        return translator.translate(sources, [prefix] * len(sources) if prefix else None)

    def cross_attention(self, source: str, target: str | None, layer: int, head: int) -> dict[str, Any]:
        """The encoder-decoder attention of decoder `layer` and `head` (0-based), teacher-forced on `target` (else
        on the model's own translation): {"source_tokens", "target_tokens", "weights"}; weights[t][s] is how much
        the decoder position that predicts target token t attends to source token s (each row sums to 1)."""
        with torch.autocast(self.model.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            maps = attention_maps(self.model, self.tokenizer, source, target)
        weights = maps.cross[layer, head]  # (T, S)
        return {
            "source_tokens": maps.source_tokens,
            "target_tokens": maps.output_tokens,
            "weights": [[round(value, 4) for value in row] for row in weights.tolist()],
        }


__all__ = ["ServingModel"]
