"""Static batch shapes for CUDA graphs (static_shapes.py), on the CPU: Multi30k's token-budget batches padded to at
most 8 shapes, with the same loss as unpadded."""

import pytest
import torch
from transformers import DataCollatorForSeq2Seq

from hf_vanilla_transformer.training.data import load_multi30k, pair_lengths, tokenize_pairs
from hf_vanilla_transformer.training.static_shapes import GRAPH_LENGTH_BUCKETS, LengthBuckets, StaticShapeCollator
from hf_vanilla_transformer.training.tokenization import special_token_ids, train_bpe_tokenizer
from hf_vanilla_transformer.training.trainer import TokenBudgetBatchSampler

from ..conftest import tiny_model

# fp32 sums in another order over padded shapes: the loss may differ by rounding alone.
LOSS_RTOL = 1e-5
MAX_TOKENS = 4096  # the Multi30k recipes' budget (8192 for multi30k-gpu: checked too)


@pytest.fixture(scope="module")
def multi30k():
    """Multi30k EN->DE train tokenized with its recipe's joint BPE of 8,000 (about half a minute on 2 cores)."""
    train = load_multi30k("en", "de", splits=("train",))["train"]
    tokenizer = train_bpe_tokenizer(list(train["source"]) + list(train["target"]), vocab_size=8000)
    tokenized = tokenize_pairs(train, tokenizer)
    return tokenizer, tokenized.select_columns(["input_ids", "attention_mask", "labels"]), pair_lengths(tokenized)


def _batches(dataset, lengths, buckets: LengthBuckets | None, max_tokens: int, epoch: int = 0):
    sizes = lengths if buckets is None else (buckets.sizes(*lengths),) * 2
    sampler = TokenBudgetBatchSampler(*sizes, max_tokens=max_tokens, seed=1)
    sampler.set_epoch(epoch)
    return sampler.batches()


@pytest.mark.parametrize("max_tokens", [MAX_TOKENS, 8192])
def test_multi30k_batches_take_at_most_the_stated_shapes(multi30k, max_tokens) -> None:
    tokenizer, dataset, lengths = multi30k
    model = tiny_model(vocab_size=len(tokenizer), **special_token_ids(tokenizer))
    buckets = LengthBuckets.fit(*lengths, GRAPH_LENGTH_BUCKETS, max_tokens)
    collate = StaticShapeCollator(
        DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100), buckets, tokenizer.pad_token_id
    )
    shapes, pairs = set(), 0
    for epoch in (0, 1):  # another epoch's shuffle: other batches, the same shapes
        for batch in _batches(dataset, lengths, buckets, max_tokens, epoch):
            collated = collate([dataset[i] for i in batch])
            assert {tuple(tensor.shape) for tensor in collated.values()} == {
                buckets.shape(collated["labels"].shape[1])
            }
            shapes.add(tuple(collated["input_ids"].shape))
            pairs += len(batch)
    assert 1 < len(shapes) <= GRAPH_LENGTH_BUCKETS
    assert all(rows * length <= max_tokens for rows, length in shapes)
    assert pairs == 2 * len(dataset)  # every pair, once an epoch
    assert 0.0 <= buckets.padding(*lengths) < 0.25  # what the buckets cost in padded tokens (a few % here)


def test_padding_to_the_buckets_leaves_the_loss_as_it_was(multi30k) -> None:
    tokenizer, dataset, lengths = multi30k
    model = tiny_model(vocab_size=len(tokenizer), **special_token_ids(tokenizer)).eval()
    base = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    buckets = LengthBuckets.fit(*lengths, GRAPH_LENGTH_BUCKETS, MAX_TOKENS)
    collate = StaticShapeCollator(base, buckets, tokenizer.pad_token_id)
    batches = [[dataset[i] for i in batch] for batch in _batches(dataset, lengths, buckets, MAX_TOKENS)[:40]]
    collated = [(base(features), collate(features)) for features in batches]
    # Batches padded by rows, by positions, and the longest of them: one of each is enough (each costs a backward).
    by_rows = next(pair for pair in collated if pair[1]["labels"].shape[0] > pair[0]["labels"].shape[0])
    by_positions = next(pair for pair in collated if pair[1]["labels"].shape[1] > pair[0]["labels"].shape[1])
    longest = max(collated, key=lambda pair: pair[0]["labels"].shape[1])
    for plain, padded in (by_rows, by_positions, longest):
        losses = []
        for batch in (plain, padded):
            model.zero_grad()
            loss = model(**batch, label_smoothing=0.1).loss
            loss.backward()
            losses.append((loss.item(), model.lm_head.weight.grad.clone()))
        assert losses[1][0] == pytest.approx(losses[0][0], rel=LOSS_RTOL)
        assert torch.isfinite(losses[1][1]).all()
        torch.testing.assert_close(losses[1][1], losses[0][1], rtol=1e-4, atol=1e-7)


def test_a_batch_longer_than_the_buckets_or_with_too_many_rows_is_refused() -> None:
    buckets = LengthBuckets.fit([5, 9, 14], [6, 9, 12], 2, 64)
    assert buckets.lengths == (9, 14)  # sizes 6, 9, 14: 9 + 9 + 14 padded tokens, the least with two buckets
    assert buckets.shape(10) == (4, 14)  # 64 // 14 rows
    with pytest.raises(ValueError, match="longer than the longest bucket"):
        buckets.shape(15)
    collate = StaticShapeCollator(lambda features: features[0], buckets, 1)
    too_many = {"input_ids": torch.ones(5, 14, dtype=torch.long), "labels": torch.ones(5, 14, dtype=torch.long)}
    with pytest.raises(ValueError, match="exceeds its bucket's 4 rows"):
        collate([too_many])
