"""hf_vanilla_transformer: the Transformer of "Attention Is All You Need" as a native Hugging Face seq2seq model.

Importing the package registers the config and models with AutoConfig / AutoModel / AutoModelForSeq2SeqLM, marks
them for `auto_map` so that saved folders carry their code (`trust_remote_code=True` where this package is not
installed), and brings back `pipeline("translation")` (and `translation_xx_to_yy`) for seq2seq models.
`prepare_for_cpu_inference(model)` is the opt-in CPU speed step for a loaded model (inference/cpu_inference.py).
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .inference.cpu_inference import prepare_for_cpu_inference
from .model.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from .model.pipeline_vanilla_translation import VanillaTranslationPipeline
from .pretrained import BUNDLED_MODEL
from .registration import register_translation_pipeline

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
register_translation_pipeline()

__all__ = [
    "BUNDLED_MODEL",
    "PRESETS",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "VanillaTranslationPipeline",
    "__version__",
    "prepare_for_cpu_inference",
]
