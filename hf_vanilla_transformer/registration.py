"""Bring back `pipeline("translation")` for our models while this package is imported.

transformers 5 lists "translation" among removed tasks and raises before it looks at its registry; the parametrized
"translation_xx_to_yy" names likewise. Registering the task and letting those names through keeps every other task
untouched. Where the package is not installed, config.json's `custom_pipelines` serves the same pipeline as remote
code (see configuration_vanilla_transformer.py).
"""

from __future__ import annotations

from transformers import AutoModelForSeq2SeqLM
from transformers import pipelines as hf_pipelines

from .configuration_vanilla_transformer import NATIVE_PIPELINE
from .pipeline_vanilla_translation import VanillaTranslationPipeline


def _is_translation_task(task: str) -> bool:
    parts = task.split("_")
    return task == "translation" or (len(parts) == 4 and parts[0] == "translation" and parts[2] == "to")


def register_translation_pipeline() -> None:
    """Register "translation" (and "translation_xx_to_yy") with transformers' pipeline registry. Idempotent."""
    if NATIVE_PIPELINE["registered"]:
        return
    registry = hf_pipelines.PIPELINE_REGISTRY
    hf_pipelines.REMOVED_TASKS.pop("translation", None)
    if "translation" not in registry.supported_tasks:
        registry.register_pipeline(
            "translation", pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )
    check_task = registry.check_task

    def check_translation_task(task: str):
        if _is_translation_task(task):
            _, targeted_task, options = check_task("translation")
            return task, targeted_task, options
        return check_task(task)

    registry.check_task = check_translation_task
    NATIVE_PIPELINE["registered"] = True
