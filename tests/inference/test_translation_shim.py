"""What registration.py's shim around transformers' pipelines relies on, checked against the installed transformers:
it fails, saying what to re-check, when transformers changes how `pipeline()` treats the removed translation task."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import transformers
from transformers import pipelines

from hf_vanilla_transformer.registration import RegisteredTranslationPipeline, removed_task_error

RECHECK = (
    "Re-check the shim in hf_vanilla_transformer/registration.py (it removes 'translation' from "
    "transformers.pipelines.REMOVED_TASKS, registers the task with PIPELINE_REGISTRY.register_pipeline and wraps "
    "PIPELINE_REGISTRY.check_task for 'translation_xx_to_yy') and its removed_task_error against transformers "
    f"{transformers.__version__}'s transformers/pipelines/__init__.py."
)
# transformers alone, in a fresh process: how it treats the translation tasks without this package.
UPSTREAM_SCRIPT = textwrap.dedent(
    """
    import json
    from transformers import pipelines
    errors = {}
    for task in ("translation", "translation_en_to_de"):
        try:
            pipelines.check_task(task)
            errors[task] = None
        except KeyError as error:
            errors[task] = error.args[0]
    print(json.dumps({
        "removed": "translation" in pipelines.REMOVED_TASKS,
        "registered": "translation" in pipelines.PIPELINE_REGISTRY.supported_tasks,
        "errors": errors,
    }))
    """
)


def test_transformers_alone_still_refuses_the_translation_task_with_the_words_the_shim_repeats() -> None:
    run = subprocess.run(
        [sys.executable, "-c", UPSTREAM_SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    upstream = json.loads(run.stdout.splitlines()[-1])
    assert upstream["removed"] and not upstream["registered"], (
        f"transformers {transformers.__version__} no longer lists 'translation' as a removed task (REMOVED_TASKS: "
        f"{upstream['removed']}, registered: {upstream['registered']}): the shim may be unneeded or wrong. {RECHECK}"
    )
    for task, error in upstream["errors"].items():
        assert error == removed_task_error(task).args[0], (
            f"transformers {transformers.__version__} refuses {task!r} with other words than the shim gives other "
            f"models ({error!r}). {RECHECK}"
        )


def test_with_the_package_both_forms_of_the_task_reach_the_registered_pipeline() -> None:
    assert "translation" not in pipelines.REMOVED_TASKS, RECHECK
    for task in ("translation", "translation_en_to_de"):
        normalized, targeted, _ = pipelines.check_task(task)
        assert (normalized, targeted["impl"]) == (task, RegisteredTranslationPipeline), RECHECK
