"""transformers' own common model tests (ModelTesterMixin, GenerationTesterMixin) run against our model.

The mixins are not part of the transformers wheel; `run.sh` assembles them outside this repository in
$TRANSFORMERS_TESTS_DIR (default /tmp/hf_tests), which holds transformers' `tests/` package. That package is imported
here under the name `transformers_tests` because this repository has a `tests` package of its own. Without that
directory conftest.py does not collect this module. The tester mirrors transformers' MarianModelTester
(tests/models/marian/test_modeling_marian.py): same sizes, same inputs, same HF attribute names.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
import unittest
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import torch
from transformers.models.auto import modeling_auto
from transformers.testing_utils import require_torch_fp16, torch_device

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
)

TESTS_DIR = Path(os.environ.get("TRANSFORMERS_TESTS_DIR", "/tmp/hf_tests"))
PACKAGE = "transformers_tests"


def import_transformers_tests(module: str) -> ModuleType:
    """Import `tests.<module>` of transformers' test suite from TESTS_DIR as `transformers_tests.<module>`."""
    if PACKAGE not in sys.modules:
        init = TESTS_DIR / "tests" / "__init__.py"
        spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
        if spec is None or spec.loader is None:
            raise ImportError(f"transformers' tests not found in {TESTS_DIR}; run tests/hf_common/run.sh")
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.{module}")


_common = import_transformers_tests("test_modeling_common")
ModelTesterMixin: Any = _common.ModelTesterMixin
ids_tensor = _common.ids_tensor
GenerationTesterMixin: Any = import_transformers_tests("generation.test_utils").GenerationTesterMixin
ConfigTester: Any = import_transformers_tests("test_configuration_common").ConfigTester

# transformers' mixins decide what a class is (base model without a head, seq2seq LM, ...) from the class names in
# its auto-mapping tables, where in-tree models like Marian are listed. Ours are listed there while the tests run.
AUTO_NAMES = {
    "MODEL_MAPPING_NAMES": "VanillaTransformerModel",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "VanillaTransformerForConditionalGeneration",
}


class VanillaTransformerModelTester:
    """Builds tiny configs and inputs for transformers' mixins; the sizes are MarianModelTester's."""

    def __init__(
        self,
        parent: unittest.TestCase,
        batch_size: int = 13,
        seq_length: int = 7,
        is_training: bool = True,
        use_labels: bool = False,
        vocab_size: int = 99,
        hidden_size: int = 16,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 4,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 100,
        eos_token_id: int = 2,
        pad_token_id: int = 1,
        bos_token_id: int = 0,
        decoder_start_token_id: int = 3,
    ) -> None:
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self) -> VanillaTransformerConfig:
        return VanillaTransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function=self.hidden_act,
            dropout=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
        )

    def prepare_config_and_inputs(self) -> tuple[VanillaTransformerConfig, dict[str, torch.Tensor]]:
        # Source ids avoid the special tokens 0-2 and end with </s>, as in MarianModelTester.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        config = self.get_config()
        attention_mask = input_ids.ne(config.pad_token_id)
        inputs_dict = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": attention_mask,
            "decoder_attention_mask": torch.ones_like(decoder_input_ids, dtype=torch.bool),
        }
        return config, inputs_dict

    def prepare_config_and_inputs_for_common(self) -> tuple[VanillaTransformerConfig, dict[str, torch.Tensor]]:
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(
        self, config: VanillaTransformerConfig, inputs_dict: dict[str, torch.Tensor]
    ) -> None:
        """Decoding 3 new tokens with the cache gives the hidden states of decoding everything without it."""
        model = VanillaTransformerModel(config).to(torch_device).eval()
        input_ids = inputs_dict["input_ids"]
        encoder_hidden_states = model.get_encoder()(input_ids, attention_mask=inputs_dict["attention_mask"])[0]
        decoder = model.get_decoder()
        decoder_input_ids = inputs_dict["decoder_input_ids"]
        decoder_mask = inputs_dict["decoder_attention_mask"].long()
        kwargs = {
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": inputs_dict["attention_mask"],
        }
        outputs = decoder(decoder_input_ids, attention_mask=decoder_mask, use_cache=True, **kwargs)
        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_mask = torch.cat([decoder_mask, torch.ones_like(next_tokens)], dim=-1)
        no_past = decoder(torch.cat([decoder_input_ids, next_tokens], dim=-1), attention_mask=next_mask, **kwargs)[0]
        past = decoder(next_tokens, attention_mask=next_mask, past_key_values=outputs.past_key_values, **kwargs)[0]
        self.parent.assertEqual(past.shape[1], next_tokens.shape[1])
        torch.testing.assert_close(past, no_past[:, -3:], atol=1e-3, rtol=1e-3)

    def check_encoder_decoder_model_standalone(
        self, config: VanillaTransformerConfig, inputs_dict: dict[str, torch.Tensor]
    ) -> None:
        """The encoder and the decoder saved and loaded on their own give the outputs of the whole model."""
        model = VanillaTransformerModel(config).to(torch_device).eval()
        outputs = model(**inputs_dict)
        with tempfile.TemporaryDirectory() as tmpdirname:
            model.get_encoder().save_pretrained(tmpdirname)
            encoder = VanillaTransformerEncoder.from_pretrained(tmpdirname).to(torch_device).eval()
        encoder_last_hidden_state = encoder(inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"])[0]
        torch.testing.assert_close(encoder_last_hidden_state, outputs.encoder_last_hidden_state, atol=1e-3, rtol=0)
        with tempfile.TemporaryDirectory() as tmpdirname:
            model.get_decoder().save_pretrained(tmpdirname)
            decoder = VanillaTransformerDecoder.from_pretrained(tmpdirname).to(torch_device).eval()
        last_hidden_state = decoder(
            input_ids=inputs_dict["decoder_input_ids"],
            attention_mask=inputs_dict["decoder_attention_mask"],
            encoder_hidden_states=outputs.encoder_last_hidden_state,
            encoder_attention_mask=inputs_dict["attention_mask"],
        )[0]
        torch.testing.assert_close(last_hidden_state, outputs.last_hidden_state, atol=1e-3, rtol=0)


class VanillaTransformerModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (VanillaTransformerModel, VanillaTransformerForConditionalGeneration)
    is_encoder_decoder = True
    test_missing_keys = True  # MarianModelTest sets False; ours passes test_correct_missing_keys
    _saved_names: ClassVar[dict[str, str | None]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        for table, name in AUTO_NAMES.items():
            mapping = getattr(modeling_auto, table)
            cls._saved_names[table] = mapping.get(VanillaTransformerConfig.model_type)
            mapping[VanillaTransformerConfig.model_type] = name

    @classmethod
    def tearDownClass(cls) -> None:
        for table, previous in cls._saved_names.items():
            mapping = getattr(modeling_auto, table)
            if previous is None:
                mapping.pop(VanillaTransformerConfig.model_type, None)
            else:
                mapping[VanillaTransformerConfig.model_type] = previous
        super().tearDownClass()

    def setUp(self) -> None:
        self.model_tester = VanillaTransformerModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VanillaTransformerConfig)

    # Counterparts of MarianModelTest's own tests.
    def test_config(self) -> None:
        self.config_tester.run_common_tests()

    def test_save_load_strict(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as tmpdirname:
                model.save_pretrained(tmpdirname)
                _, info = model_class.from_pretrained(tmpdirname, output_loading_info=True)
            self.assertEqual(set(info["missing_keys"]), set())

    def test_decoder_model_past_with_large_inputs(self) -> None:
        self.model_tester.create_and_check_decoder_model_past_large_inputs(
            *self.model_tester.prepare_config_and_inputs()
        )

    def test_encoder_decoder_model_standalone(self) -> None:
        self.model_tester.check_encoder_decoder_model_standalone(
            *self.model_tester.prepare_config_and_inputs_for_common()
        )

    @require_torch_fp16
    def test_generate_fp16(self) -> None:
        config, input_dict = self.model_tester.prepare_config_and_inputs()
        input_ids = input_dict["input_ids"].to(torch_device)
        model = VanillaTransformerForConditionalGeneration(config).eval().to(torch_device).half()
        model.generate(input_ids, attention_mask=input_ids.ne(config.pad_token_id))
        model.generate(num_beams=4, do_sample=True, early_stopping=False, num_return_sequences=3)

    def test_share_encoder_decoder_embeddings(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIs(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)
        config.share_encoder_decoder_embeddings = False
        config.tie_word_embeddings = False
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsNot(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)
