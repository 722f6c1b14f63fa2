# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug C: vLLM 0.27.1 cannot start TP>=2 on Python 3.10/3.11 (its pinned
FlashInfer fails to import there; the patch whose `Scenario:` is
bug_c:import_flashinfer_all_reduce re-pins it).

For the line under test (the top-level VERSION's), from its data: where its
series re-pins FlashInfer, red on the tree before that patch and green with
it, each with the release the line's pins.toml names (`flashinfer`,
`flashinfer-repinned`); where it does not (a tag that pins a fixed
FlashInfer, as v0.33.0), the line's tree is green with the tag's own pin.
The tree's own pinned FlashInfer is used in each case, and vLLM's
flashinfer_all_reduce module (imported by the CUDA communicator whenever
TP >= 2) is imported for real.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from replays import BUG_C, bug_c_patch

from tpfix.core.lines import get_line, read_pin_file
from tpfix.replay.harness import (
    pinned_flashinfer,
    run_scenario,
    tree_after,
    tree_before,
)
from tpfix.stages.patch import cached_tree

SPEC = BUG_C
LINE = get_line()
PINS = read_pin_file(LINE.pins)
PATCH = bug_c_patch(LINE)  # the patch that fixes bug C (None: the tag has the fix)


@pytest.fixture(scope="module", autouse=True)
def _needs_old_python():
    # The defect only exists before Python 3.12; on 3.12 this test would prove
    # nothing, so refuse to run rather than pass vacuously.
    assert sys.version_info < (3, 12), "run the suite on Python 3.10 or 3.11"


def _trees() -> dict[str, object]:
    if PATCH is None:  # the line's whole tree
        return {"after": cached_tree(LINE, upto=None)}
    return {"before": tree_before(PATCH), "after": tree_after(PATCH)}


@pytest.fixture(scope="module")
def imports() -> dict:
    """The TP>=2 import on each tree, the subprocesses concurrently (they
    are independent)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {when: pool.submit(run_scenario, tree, SPEC) for when, tree in _trees().items()}
        return {when: fut.result() for when, fut in futures.items()}


def test_the_line_says_where_bug_c_is_fixed():
    """A line re-pins FlashInfer exactly when a patch of its series fixes bug C."""
    assert (PATCH is not None) == ("flashinfer-repinned" in PINS), (PATCH, PINS)


if PATCH is not None:  # the red half, for a line whose series fixes bug C

    def test_before_patch_tp_import_dies_with_type_error(imports):
        assert pinned_flashinfer(tree_before(PATCH)) == PINS["flashinfer"]
        result = imports["before"]
        assert result["error"] == "TypeError"
        assert result["message"] == "type 'array.array' is not subscriptable"


def test_after_patch_tp_import_works_and_fusion_is_available(imports):
    shipped = PINS.get("flashinfer-repinned", PINS["flashinfer"])
    assert pinned_flashinfer(_trees()["after"]) == shipped
    result = imports["after"]
    assert result == {
        "python": list(sys.version_info[:2]),
        "flashinfer": shipped,
        "fi_ar_available": True,
    }


if PATCH is not None:  # the re-pin's other files

    def test_cubin_jit_cache_and_python_pins_move_together():
        # flashinfer-cubin must equal flashinfer-python exactly (flashinfer/jit/env.py
        # raises otherwise) and the Docker ARG drives flashinfer-jit-cache.
        new, old = PINS["flashinfer-repinned"], PINS["flashinfer"]
        tree = tree_after(PATCH)
        cuda = (tree / "requirements" / "cuda.txt").read_text()
        assert f"flashinfer-cubin=={new}" in cuda
        assert f"ARG FLASHINFER_VERSION={new}" in (tree / "docker/Dockerfile").read_text()
        assert f'"default": "{new}"' in (tree / "docker/versions.json").read_text()
        assert old not in cuda
