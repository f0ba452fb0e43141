"""The model that ships with the package: Multi30k English -> German, trained for an hour on 2 CPU cores.

`BUNDLED_MODEL` is a saved model folder (config, fp16 safetensors, tokenizer, generation config, card) that loads
offline like any other: `pipeline("translation", model=BUNDLED_MODEL)`, `hf-vanilla-transformer translate --model
PATH`. It is the `transformer-multi30k-tiny` preset trained with the `multi30k-tiny` recipe (`make train-tiny`); its
card (README.md in the folder) holds its recorded BLEU and the command that made it.
"""

from pathlib import Path

BUNDLED_MODEL = str(Path(__file__).parent / "multi30k-en-de-tiny")

__all__ = ["BUNDLED_MODEL"]
