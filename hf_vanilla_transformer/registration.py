"""Bring back `pipeline("translation")` for our models while this package is imported: the one shim around
transformers' pipelines, kept here.

transformers 5 lists "translation" in `transformers.pipelines.REMOVED_TASKS`, which `pipeline()` consults before its
registry (and for the parametrized "translation_xx_to_yy" names too), and its public ways in do not reach past that:
`PIPELINE_REGISTRY.register_pipeline("translation", ...)` alone still raises the removed-task error, and a config's
`custom_pipelines` always demands `trust_remote_code=True`. So `register_translation_pipeline` (1) removes the
"translation" entry from `REMOVED_TASKS`, (2) registers the task with `PIPELINE_REGISTRY.register_pipeline` (public)
and (3) wraps the registry's `check_task` so that "translation_xx_to_yy" resolves to it, as in transformers 4. Every
other task is untouched. tests/inference/test_translation_shim.py fails when transformers changes what the shim relies
on. The registered class serves this package's models only: for any other model (NLLB, M2M100, mBART, Marian, whose
target language needs `src_lang`/`forced_bos_token_id` handling this pipeline does not have) it raises the error
transformers raises without this package, so importing it changes nothing for them. On the CPU it prepares our model
for CPU inference (`prepare_for_cpu_inference`), as `translate` does. Where the package is not installed,
config.json's `custom_pipelines` serves the same pipeline as remote code (see configuration_vanilla_transformer.py),
with the plain model.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForSeq2SeqLM
from transformers import pipelines as hf_pipelines

from .inference.cpu_inference import prepare_for_cpu_inference
from .model.configuration_vanilla_transformer import VanillaTransformerConfig
from .model.pipeline_vanilla_translation import VanillaTranslationPipeline

# transformers' advice for the removed task, read before the entry is removed, for the error other models get.
REMOVED_TRANSLATION_HINT = hf_pipelines.REMOVED_TASKS.get(
    "translation", "Use the `text-generation` pipeline with a chat model instead."
)
MIGRATION_GUIDE = "https://github.com/huggingface/transformers/blob/main/MIGRATION_GUIDE_V5.md#pipelines"


def removed_task_error(task: str) -> KeyError:
    """The KeyError transformers raises for `task` ("translation" or "translation_xx_to_yy") without this package
    (its words; tests/model/test_pipeline_and_remote_code.py compares the two)."""
    return KeyError(
        f"The task {task} has been removed from transformers. {REMOVED_TRANSLATION_HINT} See the migration guide for "
        f"more details: {MIGRATION_GUIDE}"
    )


class RegisteredTranslationPipeline(VanillaTranslationPipeline):
    """`pipeline("translation")` while this package is imported: `VanillaTranslationPipeline` for this package's
    models, prepared for CPU inference (`prepare_for_cpu_inference`, in place) when on the CPU in eval mode; for any
    other model, transformers' own removed-task error (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model = kwargs.get("model", args[0] if args else None)
        if getattr(getattr(model, "config", None), "model_type", None) != VanillaTransformerConfig.model_type:
            raise removed_task_error(kwargs.get("task") or "translation")
        super().__init__(*args, **kwargs)
        # After super(): the pipeline has moved the model to its device. A model in training mode is left plain.
        if self.model.device.type == "cpu" and not self.model.training:
            prepare_for_cpu_inference(self.model)


def is_translation_task(task: str) -> bool:
    """ "translation" or "translation_xx_to_yy"."""
    parts = task.split("_")
    return task == "translation" or (len(parts) == 4 and parts[0] == "translation" and parts[2] == "to")


def register_translation_pipeline() -> None:
    """Register "translation" (and "translation_xx_to_yy") with transformers' pipeline registry. Idempotent: the
    registry itself tells whether it is done."""
    registry = hf_pipelines.PIPELINE_REGISTRY
    if registry.supported_tasks.get("translation", {}).get("impl") is RegisteredTranslationPipeline:
        return
    hf_pipelines.REMOVED_TASKS.pop("translation", None)
    registry.register_pipeline(
        "translation", pipeline_class=RegisteredTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    check_task = registry.check_task

    def check_translation_task(task: str) -> tuple[str, dict, Any]:
        if is_translation_task(task):
            _, targeted_task, options = check_task("translation")
            return task, targeted_task, options
        return check_task(task)

    registry.check_task = check_translation_task
