"""Hub model card for hf_vanilla_transformer models: a template filled from config.json, generation_config.json and
evaluation results, and the card of a converted checkpoint (`render_converted_card`). Rendering only: the values a
card writes are checked by hf_vanilla_transformer.hub_metadata, and the folder is uploaded by
hf_vanilla_transformer.hub."""

from .generate import (
    card_for_repository,
    card_from_results,
    render_converted_card,
    render_model_card,
    save_card,
    source_card_metadata,
    write_model_card,
)

__all__ = [
    "card_for_repository",
    "card_from_results",
    "render_converted_card",
    "render_model_card",
    "save_card",
    "source_card_metadata",
    "write_model_card",
]
