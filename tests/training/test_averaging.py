"""§6.1 checkpoint averaging: the mean of known state dicts, float32 accumulation, refusals, a loadable folder."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.training.averaging import average_checkpoints, last_checkpoints, write_averaged_model

from ..conftest import tiny_model


def write_checkpoint(folder, tensors: dict[str, torch.Tensor], config: dict | None = None):
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_mean_of_two_known_state_dicts(tmp_path) -> None:
    first = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5]), "steps": torch.tensor([7])}
    second = {"w": torch.tensor([[3.0, 0.0], [-3.0, 8.0]]), "b": torch.tensor([1.5]), "steps": torch.tensor([7])}
    paths = [write_checkpoint(tmp_path / "a", first), write_checkpoint(tmp_path / "b", second)]
    averaged = average_checkpoints(paths)
    assert torch.equal(averaged["w"], torch.tensor([[2.0, 1.0], [0.0, 6.0]]))
    assert torch.equal(averaged["b"], torch.tensor([1.0]))
    assert torch.equal(averaged["steps"], torch.tensor([7])) and averaged["steps"].dtype == torch.int64


def test_low_precision_tensors_are_accumulated_in_float32(tmp_path) -> None:
    """bf16 keeps 8 significant bits: 256 + 1 rounds back to 256, so a bf16 running sum would lose the ones."""
    values = [256.0, 1.0, 1.0, 1.0]
    paths = [
        write_checkpoint(tmp_path / str(i), {"x": torch.tensor([value], dtype=torch.bfloat16)})
        for i, value in enumerate(values)
    ]
    averaged = average_checkpoints(paths)["x"]
    assert averaged.dtype == torch.bfloat16
    assert averaged.item() == torch.tensor(sum(values) / 4).to(torch.bfloat16).item()  # 64.75 -> 65 in bf16
    naive = sum(load_file(path / "model.safetensors")["x"] for path in paths) / 4
    assert naive.item() != averaged.item()  # the test would notice bf16 accumulation


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"w": torch.zeros(2, 2), "extra": torch.zeros(1)}, r"different tensors .* extra \['extra'\]"),
        ({"w": torch.zeros(2, 3)}, r"Tensor `w` is \(2, 3\) torch.float32 in .* but \(2, 2\) torch.float32"),
        ({"w": torch.zeros(2, 2, dtype=torch.float16)}, "torch.float16 in .* but .* torch.float32"),
        ({"v": torch.zeros(2, 2)}, r"different tensors .* missing \['w'\], extra \['v'\]"),
        ({"w": torch.zeros(4)}, r"Tensor `w` is \(4,\) torch.float32 in .* but \(2, 2\) torch.float32"),  # same numel
        ({"w": torch.zeros(2, 2, dtype=torch.int64)}, r"torch.int64 in .* but \(2, 2\) torch.float32"),
        ({"w": torch.zeros(2, 2, dtype=torch.bfloat16)}, "torch.bfloat16 in .* but .* torch.float32"),
    ],
)
def test_mismatched_checkpoints_are_refused(tmp_path, second, message) -> None:
    paths = [write_checkpoint(tmp_path / "a", {"w": torch.ones(2, 2)}), write_checkpoint(tmp_path / "b", second)]
    with pytest.raises(ValueError, match=message):
        average_checkpoints(paths)


def test_differing_integer_tensors_and_configs_are_refused(tmp_path) -> None:
    paths = [
        write_checkpoint(tmp_path / "a", {"n": torch.tensor([1])}),
        write_checkpoint(tmp_path / "b", {"n": torch.tensor([2])}),
    ]
    with pytest.raises(ValueError, match="Non-float tensor `n` differs"):
        average_checkpoints(paths)
    paths = [
        write_checkpoint(tmp_path / "c", {"w": torch.ones(1)}, {"d_model": 8, "transformers_version": "5.0"}),
        write_checkpoint(tmp_path / "d", {"w": torch.ones(1)}, {"d_model": 16, "transformers_version": "5.1"}),
    ]
    with pytest.raises(ValueError, match=r"config.json of .*d differs from that of .*c in \['d_model'\]"):
        average_checkpoints(paths)


def test_a_mismatch_in_a_later_checkpoint_is_refused_naming_it(tmp_path) -> None:
    paths = [write_checkpoint(tmp_path / name, {"w": torch.ones(2)}) for name in ("a", "b")]
    paths.append(write_checkpoint(tmp_path / "c", {"w": torch.ones(3)}))
    with pytest.raises(ValueError, match=r"Tensor `w` is \(3,\) torch.float32 in .*c but \(2,\) torch.float32 in .*a"):
        average_checkpoints(paths)


def test_config_json_in_only_one_checkpoint_is_refused(tmp_path) -> None:
    paths = [
        write_checkpoint(tmp_path / "a", {"w": torch.ones(1)}, {"d_model": 8}),
        write_checkpoint(tmp_path / "b", {"w": torch.ones(1)}),
    ]
    with pytest.raises(ValueError, match=r"config.json of .*b differs from that of .*a in \['d_model'\]"):
        average_checkpoints(paths)
    with pytest.raises(ValueError, match=r"config.json of .*a differs from that of .*b in \['d_model'\]"):
        average_checkpoints(paths[::-1])


def test_configs_differing_only_in_bookkeeping_are_averaged(tmp_path) -> None:
    """transformers_version, _name_or_path, dtype and use_cache change between saves of one model."""
    first = {"d_model": 8, "transformers_version": "5.0", "_name_or_path": "a", "dtype": "float32", "use_cache": True}
    second = {"d_model": 8, "transformers_version": "5.1", "_name_or_path": "b", "dtype": "bfloat16"}
    paths = [
        write_checkpoint(tmp_path / "a", {"w": torch.tensor([1.0])}, first),
        write_checkpoint(tmp_path / "b", {"w": torch.tensor([3.0])}, second),
    ]
    assert torch.equal(average_checkpoints(paths)["w"], torch.tensor([2.0]))


def test_a_tensor_repeated_across_shards_is_refused(tmp_path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    save_file({"w": torch.zeros(2), "b": torch.ones(1)}, folder / "model-00002-of-00002.safetensors")
    with pytest.raises(
        ValueError, match=r"model-00002-of-00002.safetensors repeats tensors of another shard .*\['w'\]"
    ):
        average_checkpoints([folder])


def test_models_of_different_configs_are_refused_before_writing(tmp_path) -> None:
    """Same tensor names and shapes, different dropout: still two different models; nothing is written."""
    tiny_model(seed=0).save_pretrained(tmp_path / "checkpoint-1")
    tiny_model(seed=1, dropout=0.3).save_pretrained(tmp_path / "checkpoint-2")
    with pytest.raises(
        ValueError, match=r"config.json of .*checkpoint-2 differs from that of .*checkpoint-1 in \['dropout'\]"
    ):
        write_averaged_model([tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"], tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists()


def test_missing_and_empty_inputs_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="`paths` is empty"):
        average_checkpoints([])
    with pytest.raises(ValueError, match="does not exist"):
        average_checkpoints([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no .safetensors file"):
        average_checkpoints([tmp_path / "empty"])


def test_last_checkpoints_orders_by_step_number(tmp_path) -> None:
    for step in (9, 10, 100, 11):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-final").mkdir()
    assert [path.name for path in last_checkpoints(tmp_path, 3)] == [
        "checkpoint-10",
        "checkpoint-11",
        "checkpoint-100",
    ]
    with pytest.raises(ValueError, match=r"Found 4 checkpoints in .*; averaging the last 5 needs at least 5"):
        last_checkpoints(tmp_path, 5)


def test_average_last_skips_a_checkpoint_whose_save_was_interrupted(tmp_path, capsys) -> None:
    """The Trainer writes trainer_state.json last: checkpoint-3 without a readable one (a kill mid-save) is not
    averaged by `average --last`."""
    from hf_vanilla_transformer import cli

    folder = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        tiny_model(seed=step).save_pretrained(folder / f"checkpoint-{step}")
        state = json.dumps({"global_step": step}) if step < 3 else '{"global_st'  # truncated by the kill
        (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    assert [path.name for path in last_checkpoints(folder, 2, complete_only=True)] == ["checkpoint-1", "checkpoint-2"]
    assert cli.main(["average", str(folder), "--last", "2", "-o", str(tmp_path / "averaged")]) == 0
    assert "checkpoint-1, checkpoint-2" in capsys.readouterr().out
    key = "model.encoder.layers.0.fc1.weight"
    first, second = (load_file(folder / f"checkpoint-{step}" / "model.safetensors")[key] for step in (1, 2))
    averaged = load_file(tmp_path / "averaged" / "model.safetensors")[key]
    torch.testing.assert_close(averaged, (first + second) / 2, atol=0, rtol=0)


def test_averaged_folder_loads_with_the_mean_weights(tmp_path) -> None:
    models = [tiny_model(seed=seed) for seed in (0, 1, 2)]
    paths = []
    for index, model in enumerate(models):
        model.save_pretrained(tmp_path / f"checkpoint-{index}")
        paths.append(tmp_path / f"checkpoint-{index}")
    output = write_averaged_model(paths, tmp_path / "averaged")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(output)
    for key, value in loaded.state_dict().items():
        expected = sum(model.state_dict()[key] for model in models) / 3
        torch.testing.assert_close(value, expected, msg=key)
    assert loaded.model.shared.weight is loaded.lm_head.weight  # tying survives
    assert "auto_map" in json.loads((output / "config.json").read_text())
    assert (output / "modeling_vanilla_transformer.py").is_file()
    with pytest.raises(ValueError, match="is one of the checkpoints to average"):
        write_averaged_model(paths, paths[0])
