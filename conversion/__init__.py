"""Importers of foreign checkpoints into hf_vanilla_transformer, and the exporters to MarianMTModel and ONNX
(docs/conversion.md).

A library first: each format is a module with typed options and one function, e.g.
`fairseq.convert(fairseq.FairseqOptions(source, output_dir, reference=...))`, which returns what it wrote and
measured (`_common.Finished`) and prints nothing. `conversion/_common.py` holds the shared key map, logit checks and
the `finish` step every format ends with. The command line, `python -m conversion <format> SOURCE OUTPUT_DIR
[options]` (`conversion/__main__.py`), maps flags to the options and prints the result; `--help` lists the formats.
"""
