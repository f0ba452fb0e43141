"""Importers of foreign checkpoints into hf_vanilla_transformer, and the exporter to MarianMTModel
(docs/conversion.md).

Run as `python -m conversion <format> SOURCE OUTPUT_DIR [options]`; `python -m conversion --help` lists the formats.
Each format is a module with `add_arguments(parser)` and `convert(args)`, registered in `conversion/__main__.py`;
`conversion/_common.py` holds the shared key map, logit check and folder writer.
"""
