# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug C scenario: the CUDA communicator's FlashInfer import on Python < 3.12.

Real code only: vLLM's own flashinfer_all_reduce module from the tree, with
the FlashInfer release the tree pins.  Nothing is simulated; on a CPU host the
module still imports (FlashInfer's comm package is pure Python at import).
"""

import sys

from tpfix.replay.verdict import by_exception


def import_flashinfer_all_reduce() -> dict:
    import flashinfer
    import vllm.distributed.device_communicators.flashinfer_all_reduce as far

    return {
        "python": list(sys.version_info[:2]),
        "flashinfer": flashinfer.__version__,
        "fi_ar_available": far.fi_ar_available,
    }


def check_import_flashinfer_all_reduce(result: dict) -> bool | None:
    """Fixed: the import works and the fused all-reduce is available; the
    bug: FlashInfer's `array.array[int]` annotation raises TypeError."""
    available = lambda r: r.get("fi_ar_available") is True
    return by_exception(result, "TypeError", "array.array", available)
