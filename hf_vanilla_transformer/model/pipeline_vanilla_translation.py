"""The translation pipeline that transformers 5 removed, for seq2seq models: `[{"translation_text": ...}]` as in
transformers 4. Imports only transformers, so that it is saved next to a model and runs as remote code."""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig, Pipeline


class VanillaTranslationPipeline(Pipeline):
    """Translate text with an encoder-decoder model.

    `pipeline("translation", model=...)(["A man.", "A dog."], batch_size=2, num_beams=4, max_new_tokens=64)` returns
    `[{"translation_text": ...}, ...]`, one dict per input (a list of dicts per input with num_return_sequences > 1);
    a single string gives `[{"translation_text": ...}]`. Generation parameters are
    passed to `model.generate`; the model's own `generation_config` (e.g. the paper's beam 4, α 0.6) is the default.
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _default_generation_config = GenerationConfig(max_new_tokens=256)

    def __init__(self, *args: Any, src_lang: str | None = None, tgt_lang: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.src_lang = src_lang
        self.tgt_lang = tgt_lang
        # A task "translation_xx_to_yy" names the languages, as in transformers 4.
        parts = (self.task or "").split("_")
        if len(parts) == 4 and parts[0] == "translation" and parts[2] == "to":
            self.src_lang = self.src_lang or parts[1]
            self.tgt_lang = self.tgt_lang or parts[3]

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        return_tensors: bool | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        preprocess_params: dict[str, Any] = {}
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        if src_lang is not None:
            self.src_lang = src_lang
        if tgt_lang is not None:
            self.tgt_lang = tgt_lang
        postprocess_params: dict[str, Any] = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        return preprocess_params, {"generate_kwargs": generate_kwargs}, postprocess_params

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        if isinstance(inputs, str):
            return super().__call__(inputs, **kwargs)
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(text, str) for text in inputs):
            raise ValueError(f"`inputs` must be a string or a list of strings, got {type(inputs).__name__}.")
        results = super().__call__(list(inputs), **kwargs)
        # As transformers 4: one dict per input unless several sequences per input were asked for.
        if all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, Any]:
        prefix = self.prefix or ""
        return self.tokenizer(prefix + text, return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs: dict[str, Any], generate_kwargs: dict[str, Any]) -> dict[str, Any]:
        user_set = self._get_set_generation_params({**self._generate_kwargs, **generate_kwargs})
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        if "max_new_tokens_offset" in user_set and not {"max_new_tokens", "max_length"} & user_set.keys():
            # Paper decoding (§6.1) limits each example to its source length + offset; the pipeline's default
            # max_new_tokens would cap that.
            generate_kwargs.pop("max_new_tokens", None)
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        in_batch = model_inputs["input_ids"].shape[0]
        return {"output_ids": output_ids.reshape(in_batch, -1, output_ids.shape[-1])}

    def postprocess(
        self, model_outputs: dict[str, Any], clean_up_tokenization_spaces: bool = False, return_tensors: bool = False
    ) -> list[dict[str, Any]]:
        records = []
        for output_ids in model_outputs["output_ids"][0]:
            if return_tensors:
                records.append({"translation_token_ids": output_ids})
                continue
            text = self.tokenizer.decode(
                output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
            )
            records.append({"translation_text": text})
        return records
