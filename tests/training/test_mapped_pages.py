"""A corpus read through its memory map does not stay in the resident set: mapped_pages releases exactly the pages
of the named files, and the data reads the same afterwards."""

import sys

import pytest
from datasets import Dataset

from hf_vanilla_transformer.training.mapped_pages import ReleaseCorpusPagesCallback, corpus_files, release_mapped_pages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="resident pages are counted from /proc (Linux)")


def resident_kib(path: str) -> int:
    """Rss of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                inside = len(fields) == 6 and fields[5] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def corpus(folder, name: str, rows: int) -> Dataset:
    def pairs():
        for index in range(rows):
            yield {"source": f"{name} sentence {index} " + "x" * 120, "target": f"Satz {index} " + "y" * 120}

    return Dataset.from_generator(pairs, cache_dir=str(folder / name))


def test_release_drops_the_pages_read_and_the_data_reads_the_same(tmp_path) -> None:
    first, second = corpus(tmp_path, "first", 60_000), corpus(tmp_path, "second", 60_000)
    [first_file], [second_file] = corpus_files(first), corpus_files(second)
    before = [batch["source"] for batch in first.iter(batch_size=10_000)]
    sum(len(batch["source"]) for batch in second.iter(batch_size=10_000))
    assert resident_kib(first_file) > 8_000 and resident_kib(second_file) > 8_000  # ~15 MB each, read through
    released = release_mapped_pages([first_file])
    assert released >= 8_000 * 1024
    assert resident_kib(first_file) < 100
    assert resident_kib(second_file) > 8_000  # another file's mapping is left alone
    assert [batch["source"] for batch in first.iter(batch_size=10_000)] == before


def test_nothing_to_release_for_a_dataset_in_memory_or_no_file() -> None:
    assert corpus_files(Dataset.from_dict({"source": ["a"], "target": ["b"]})) == []
    assert release_mapped_pages([]) == 0
    assert release_mapped_pages(["/nonexistent/file.arrow"]) == 0


def test_the_training_callback_releases_every_few_updates(tmp_path) -> None:
    dataset = corpus(tmp_path, "train", 60_000)
    [path] = corpus_files(dataset)
    callback = ReleaseCorpusPagesCallback(dataset, every=10)

    class State:
        global_step = 9

    sum(len(batch["target"]) for batch in dataset.iter(batch_size=10_000))
    callback.on_step_end(None, State(), None)
    assert resident_kib(path) > 8_000  # not a tenth update
    State.global_step = 10
    callback.on_step_end(None, State(), None)
    assert resident_kib(path) < 100
