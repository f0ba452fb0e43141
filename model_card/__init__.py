"""Hub model card for hf_vanilla_transformer models: a template filled from config.json, generation_config.json and
evaluation results, the card of a converted checkpoint (`render_converted_card`), the checks of the values a card
writes (`check_language`, `check_license`, `check_repo_id`, `public_command`), and an upload of the finished folder
(`push_folder_to_hub`)."""

from .generate import (
    HUB_FILES,
    HUB_LICENSES,
    RepositoryNotEmptyError,
    card_for_repository,
    card_from_results,
    check_language,
    check_license,
    check_repo_id,
    code_files,
    hub_files,
    public_command,
    public_path,
    push_folder_to_hub,
    render_converted_card,
    render_model_card,
    save_card,
    source_card_metadata,
    write_model_card,
)

__all__ = [
    "HUB_FILES",
    "HUB_LICENSES",
    "RepositoryNotEmptyError",
    "card_for_repository",
    "card_from_results",
    "check_language",
    "check_license",
    "check_repo_id",
    "code_files",
    "hub_files",
    "public_command",
    "public_path",
    "push_folder_to_hub",
    "render_converted_card",
    "render_model_card",
    "save_card",
    "source_card_metadata",
    "write_model_card",
]
