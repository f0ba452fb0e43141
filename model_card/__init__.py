"""Hub model card for hf_vanilla_transformer models: a template filled from config.json, generation_config.json and
evaluation results, the card of a converted checkpoint (`render_converted_card`), and an upload of the finished folder
(`push_folder_to_hub`). The values a card writes are checked by hf_vanilla_transformer.hub_metadata."""

from .generate import (
    HUB_FILES,
    RepositoryNotEmptyError,
    card_for_repository,
    card_from_results,
    code_files,
    hub_files,
    push_folder_to_hub,
    render_converted_card,
    render_model_card,
    save_card,
    source_card_metadata,
    write_model_card,
)

__all__ = [
    "HUB_FILES",
    "RepositoryNotEmptyError",
    "card_for_repository",
    "card_from_results",
    "code_files",
    "hub_files",
    "push_folder_to_hub",
    "render_converted_card",
    "render_model_card",
    "save_card",
    "source_card_metadata",
    "write_model_card",
]
