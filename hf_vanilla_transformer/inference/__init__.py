"""Using a trained model: loading, translation and evaluation, int8 layers and the opt-in CPU speed step."""

from .cpu_inference import prepare_for_cpu_inference

__all__ = ["prepare_for_cpu_inference"]
