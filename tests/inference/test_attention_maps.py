"""Attention maps: eq. (1) weights of one sentence, plotted as layers × heads grids, from Python and the CLI."""

from pathlib import Path

import pytest
import torch
from matplotlib.image import imread

from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.inference.attention_maps import attention_maps, plot_attention

from ..conftest import tiny_model, tiny_tokenizer

SOURCE = "w5 w6 w7 w8 w9"
TARGET = "w10 w11 w12"
STEMS = ["encoder_self_attention", "decoder_self_attention", "cross_attention"]


def test_maps_are_probability_rows_with_the_papers_masks() -> None:
    model = tiny_model()
    maps = attention_maps(model, tiny_tokenizer(), SOURCE, TARGET)
    assert maps.source_tokens == [*SOURCE.split(), "</s>"]
    assert maps.decoder_input_tokens == ["<pad>", *TARGET.split()]  # start token, then the target shifted right
    assert maps.output_tokens == [*TARGET.split(), "</s>"]
    layers, heads, source_len, target_len = 2, 4, 6, 4
    assert maps.encoder.shape == (layers, heads, source_len, source_len)
    assert maps.decoder.shape == (layers, heads, target_len, target_len)
    assert maps.cross.shape == (layers, heads, target_len, source_len)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert (weights >= 0).all()
    # §3.2.3: decoder position i sees positions <= i only.
    future = torch.triu(torch.ones(target_len, target_len, dtype=torch.bool), diagonal=1)
    assert (maps.decoder[..., future] == 0).all() and (maps.decoder[..., ~future] > 0).all()
    assert model.config._attn_implementation == "sdpa"  # switched to eager for the maps only


def test_without_target_the_models_translation_is_used() -> None:
    model, tokenizer = tiny_model(), tiny_tokenizer()
    generated = model.generate(**tokenizer(SOURCE, return_tensors="pt"), max_new_tokens=5)[0].tolist()
    maps = attention_maps(model, tokenizer, SOURCE, generation_kwargs={"max_new_tokens": 5})
    assert maps.output_tokens == tokenizer.convert_ids_to_tokens(generated[1:])
    assert maps.cross.shape[2] == len(generated) - 1


def test_plot_writes_one_grid_per_kind(tmp_path: Path) -> None:
    paths = plot_attention(
        tiny_model(), tiny_tokenizer(), SOURCE, TARGET, out_dir=tmp_path / "maps", layers=[1], heads=[0, 1, 2]
    )
    assert paths == [tmp_path / "maps" / f"{stem}.png" for stem in STEMS]
    for path in paths:
        height, width, _ = imread(path).shape  # a valid PNG
        assert width > 2 * height  # 1 layer x 3 heads


def test_bad_layer_names_the_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`layers` holds 2, but the encoder has 2 layers"):
        plot_attention(tiny_model(), tiny_tokenizer(), SOURCE, TARGET, out_dir=tmp_path, layers=[2])


def test_cli_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = tiny_model()
    model.generation_config.max_new_tokens = 5
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    assert main(["attention", str(tmp_path / "model"), SOURCE, "--out", str(tmp_path / "out")]) == 0
    written = [tmp_path / "out" / f"{stem}.png" for stem in STEMS]
    assert capsys.readouterr().out.split() == [str(path) for path in written]
    assert all(imread(path).ndim == 3 for path in written)
