"""End to end through Seq2SeqTrainer: a reversal task learned to ≥ 99% exact match, greedy and beam."""

import random

import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

from ..conftest import tiny_tokenizer

SYMBOLS = [f"w{i}" for i in range(4, 20)]


def reversal_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(SYMBOLS) for _ in range(rng.randint(3, 8))]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def test_seq2seq_trainer_learns_reversal_with_label_smoothing(tmp_path) -> None:
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_paper(
        N=2, d_model=64, d_ff=256, h=4, P_drop=0.0, vocab_size=len(tokenizer), max_position_embeddings=32
    )
    model = VanillaTransformerForConditionalGeneration(config)
    train = [dict(tokenizer(src, text_target=tgt)) for src, tgt in reversal_pairs(6000, seed=0)]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=64,
        num_train_epochs=6,
        learning_rate=2e-3,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        warmup_steps=60,
        label_smoothing_factor=0.1,
        save_strategy="no",
        report_to=[],
        logging_steps=1000,
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train, data_collator=collator)
    trainer.train()
    model.eval()

    test = reversal_pairs(200, seed=1)
    batch = tokenizer([src for src, _ in test], return_tensors="pt", padding=True)
    for num_beams in (1, 4):
        with torch.no_grad():
            out = model.generate(**batch, num_beams=num_beams, max_new_tokens=12)
        predictions = tokenizer.batch_decode(out, skip_special_tokens=True)
        exact = sum(p == tgt for p, (_, tgt) in zip(predictions, test, strict=True)) / len(test)
        assert exact >= 0.99, (num_beams, exact)
