"""`gnmt_beam_search` (model/generation_vanilla_transformer.py) mirrors transformers' beam search step by step, with
GNMT's length penalty in place of |Y|^α; transformers' loop has no hook for another penalty. These digests of the
upstream functions it mirrors, per supported transformers version, tell when that code changes under it."""

from __future__ import annotations

import hashlib
import inspect

import pytest
import transformers
from transformers.generation.utils import GenerationMixin

# sha256 (first 16 hex digits) of inspect.getsource of each GenerationMixin method that gnmt_beam_search mirrors.
UPSTREAM_BEAM_SEARCH = {
    "5.23.0": {
        "_beam_search": "81a178e0a4023c89",
        "_get_top_k_continuations": "f97371d68ca6c5b1",
        "_get_running_beams_for_next_iteration": "d5e1907d4c1ebaf5",
        "_update_finished_beams": "7709efbd517fc29b",
        "_check_early_stop_heuristic": "4a0a41084c0e073c",
        "_beam_search_has_unfinished_sequences": "000ca36ba5d0d583",
    },
    "5.24.0": {
        "_beam_search": "4de7e12f0df30817",
        "_get_top_k_continuations": "175258172266656b",
        "_get_running_beams_for_next_iteration": "d5e1907d4c1ebaf5",
        "_update_finished_beams": "7709efbd517fc29b",
        "_check_early_stop_heuristic": "4a0a41084c0e073c",
        "_beam_search_has_unfinished_sequences": "000ca36ba5d0d583",
    },
}
MIRRORED = tuple(UPSTREAM_BEAM_SEARCH["5.24.0"])
RECHECK = (
    "Re-check gnmt_beam_search in hf_vanilla_transformer/model/generation_vanilla_transformer.py against it (the "
    "candidates kept per step, which continuations finish, the early-stopping bounds, the outputs, the cache "
    "reordering, the model kwargs the loop passes), carry over what changed, then record the new digests in "
    "UPSTREAM_BEAM_SEARCH."
)


def digest(name: str) -> str:
    return hashlib.sha256(inspect.getsource(getattr(GenerationMixin, name)).encode()).hexdigest()[:16]


def test_the_installed_transformers_is_one_the_gnmt_loop_was_checked_against() -> None:
    version = transformers.__version__
    assert version in UPSTREAM_BEAM_SEARCH, (
        f"gnmt_beam_search was checked against transformers {sorted(UPSTREAM_BEAM_SEARCH)}, not {version}: read "
        f"GenerationMixin.{', GenerationMixin.'.join(MIRRORED)} of {version}. {RECHECK}"
    )


@pytest.mark.parametrize("name", MIRRORED)
def test_transformers_beam_search_is_the_code_the_gnmt_loop_mirrors(name: str) -> None:
    recorded = UPSTREAM_BEAM_SEARCH.get(transformers.__version__)
    if recorded is None:
        pytest.fail(f"no digests recorded for transformers {transformers.__version__}. {RECHECK}")
    assert digest(name) == recorded[name], (
        f"transformers {transformers.__version__} changed GenerationMixin.{name}, which gnmt_beam_search mirrors "
        f"(digest {digest(name)}, recorded {recorded[name]}). {RECHECK}"
    )
