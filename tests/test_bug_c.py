# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug C: vLLM 0.27.1 cannot start TP>=2 on Python 3.10/3.11 (patch 0001).

Red before the patch, green after: the tree's own pinned FlashInfer is used
in each case, and vLLM's flashinfer_all_reduce module (imported by the CUDA
communicator whenever TP >= 2) is imported for real.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tpfix.replay.harness import pinned_flashinfer, run_scenario, tree_after, tree_before

PATCH = "0001-flashinfer-0.6.16.post4-python-3.10-3.11.patch"


@pytest.fixture(scope="module", autouse=True)
def _needs_old_python():
    # The defect only exists before Python 3.12; on 3.12 this test would prove
    # nothing, so refuse to run rather than pass vacuously.
    assert sys.version_info < (3, 12), "run the suite on Python 3.10 or 3.11"


@pytest.fixture(scope="module")
def imports() -> dict:
    """The TP>=2 import on the tree before and after the patch, the two
    subprocesses concurrently (they are independent)."""
    trees = {"before": tree_before(PATCH), "after": tree_after(PATCH)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            when: pool.submit(run_scenario, tree, "bug_c:import_flashinfer_all_reduce")
            for when, tree in trees.items()
        }
        return {when: fut.result() for when, fut in futures.items()}


def test_before_patch_tp_import_dies_with_type_error(imports):
    assert pinned_flashinfer(tree_before(PATCH)) == "0.6.16.post3"
    result = imports["before"]
    assert result["error"] == "TypeError"
    assert result["message"] == "type 'array.array' is not subscriptable"


def test_after_patch_tp_import_works_and_fusion_is_available(imports):
    assert pinned_flashinfer(tree_after(PATCH)) == "0.6.16.post4"
    result = imports["after"]
    assert result == {
        "python": list(sys.version_info[:2]),
        "flashinfer": "0.6.16.post4",
        "fi_ar_available": True,
    }


def test_cubin_jit_cache_and_python_pins_move_together():
    # flashinfer-cubin must equal flashinfer-python exactly (flashinfer/jit/env.py
    # raises otherwise) and the Docker ARG drives flashinfer-jit-cache.
    tree = tree_after(PATCH)
    cuda = (tree / "requirements" / "cuda.txt").read_text()
    assert "flashinfer-cubin==0.6.16.post4" in cuda
    assert "ARG FLASHINFER_VERSION=0.6.16.post4" in (tree / "docker/Dockerfile").read_text()
    assert '"default": "0.6.16.post4"' in (tree / "docker/versions.json").read_text()
    assert "0.6.16.post3" not in cuda
