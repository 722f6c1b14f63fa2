# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Verdicts on scenario results: the fixed behaviour, the bug, or undecided.

A scenario function `f` of tpfix.replay.<module> that shows a patch's fix
(named by a `Scenario: module:f` field of the patch header, see
harness.scenario_check) has its verdict next to it: `check_f(result)` in
the same module returns True when f's result dict shows the fixed
behaviour, False when it shows the bug, None when it shows neither (the
scenario broke for another reason: then the check decides nothing).
"""

from __future__ import annotations

from collections.abc import Callable


def by_exception(
    result: dict, bug: str, message: str = "", fixed: Callable[[dict], bool] = lambda r: True
) -> bool | None:
    """The bug is exception `bug` whose message contains `message`; any other
    exception is undecided; no exception: `fixed(result)`."""
    if "error" not in result:
        return bool(fixed(result))
    if result["error"] == bug and message in result.get("message", ""):
        return False
    return None
