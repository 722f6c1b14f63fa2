# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The preflight as the tests call it (test_doctor, test_doctor_deployments):
serve lines on the model configurations of tests/fixtures/models, and the
doctor's exit code, JSON report and stderr."""

from __future__ import annotations

import json
from pathlib import Path

from tpfix.preflight import doctor
from tpfix.replay.harness import keep_interpreters

# The tests run the preflight dozens of times in each process: the scenario
# interpreters (vLLM imported, nothing run but in forks) serve the next run.
keep_interpreters()

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"


def serve(model: str, *opts: str) -> list[str]:
    """The doctor's arguments for `vllm serve <fixture model> opts`."""
    return ["--", "vllm", "serve", str(MODELS / model), *opts]


def spec(draft: str, method: str = "draft_model") -> list[str]:
    """--speculative-config with a fixture model as the drafter."""
    cfg = {"method": method, "model": str(MODELS / draft), "num_speculative_tokens": 3}
    return ["--speculative-config", json.dumps(cfg)]


def run_doctor(argv: list[str], capsys) -> tuple[int, dict | None, str]:
    """main(--json ...): exit code, the JSON report, stderr."""
    code = doctor.main(["--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out), err
