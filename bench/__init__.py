"""Benchmarks of hf_vanilla_transformer against Hugging Face's MarianMTModel (same architecture, same run)."""
