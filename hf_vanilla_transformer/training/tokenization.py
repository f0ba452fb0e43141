"""§5.1 "Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary": a joint BPE
trained with the `tokenizers` library and wrapped as a transformers fast tokenizer (`PreTrainedTokenizerFast`).

Design, chosen so that decoding gives back the text exactly (no tokenizer-made spacing around punctuation):
- NFC normalization, so that composed and decomposed umlauts are one token sequence;
- Metaspace pre-tokenization (spaces become "▁", as SentencePiece) then punctuation split off as its own pieces;
  both only split the text, so the decoder's concatenation restores it;
- byte fallback: a character not seen in training becomes its UTF-8 bytes (`<0x00>` ... `<0xFF>`, 256 ordinary
  vocabulary entries), never `<unk>`;
- special tokens `<s>`, `<pad>`, `</s>`, `<unk>` with ids 0, 1, 2, 3 (the config's defaults); every sequence, source
  and target, ends with `</s>` (a TemplateProcessing post-processor).

Special-token strings in the text ("<pad>", "</s>", ...) are encoded as text (`split_special_tokens=True`), so they
round trip too. The only text that does not round trip is leading whitespace, which Metaspace drops (and non-NFC
input, which comes back NFC).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
BYTE_TOKENS = tuple(f"<0x{byte:02X}>" for byte in range(256))
DEFAULT_VOCAB_SIZE = 8000
# Long enough for any sentence-level corpus; the model's sinusoids extend past it if ever needed.
DEFAULT_MODEL_MAX_LENGTH = 1024
# A learned vocabulary below this share of `vocab_size` is worth a warning: the text ran out of merges.
_SHORT_VOCAB_SHARE = 0.9

logger = logging.getLogger(__name__)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train a joint BPE vocabulary of `vocab_size` entries (specials and the 256 byte tokens included) on `texts`,
    e.g. the source and target sides of the training data together (§5.1), and return it as a fast tokenizer.

    `tokenizer(source, text_target=target)` then gives `input_ids` and `labels`, both ending in `</s>`.
    """
    floor = len(SPECIAL_TOKENS) + len(BYTE_TOKENS) + 1
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < floor:
        raise ValueError(
            f"`vocab_size` must be an integer of at least {floor} (4 special + 256 byte tokens + merges), got "
            f"{vocab_size!r}. The Multi30k recipe uses {DEFAULT_VOCAB_SIZE}."
        )
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"), pre_tokenizers.Punctuation()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(BYTE_TOKENS),
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("The tokenizer saw no text to learn from: pass a non-empty iterable of sentences.")

    # The BPE trainer knows no byte fallback: append the byte tokens as ordinary entries (special tokens would be
    # dropped by `skip_special_tokens=True`) and switch the model to fall back on them.
    state = json.loads(tokenizer.to_str())
    vocab = state["model"]["vocab"]
    for token in BYTE_TOKENS:
        vocab.setdefault(token, len(vocab))
    state["model"]["byte_fallback"] = True
    if len(vocab) < _SHORT_VOCAB_SHARE * vocab_size:  # the trainer stops where no pair is left to merge
        logger.warning(
            "`vocab_size=%d` asked for, the BPE learned %d tokens: the training text has no more merges to make; "
            "pass a smaller `vocab_size` (e.g. %d) or more data.",
            vocab_size,
            len(vocab),
            len(vocab),
        )
    tokenizer = Tokenizer.from_str(json.dumps(state))
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    eos_id = tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        # "<pad>", "</s>", ... typed by a user are text, encoded as such; the specials come only from the template.
        split_special_tokens=True,
    )


def special_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The config fields for the tokenizer's special tokens; the decoder starts from `<pad>` (Marian's convention)."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
    }


__all__ = ["DEFAULT_VOCAB_SIZE", "SPECIAL_TOKENS", "special_token_ids", "train_bpe_tokenizer"]
