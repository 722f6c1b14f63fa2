#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# The test command: lint, then the whole pytest suite (tests/).
# Sets up build/venv (build + test requirements, and vLLM v0.27.1's common
# runtime requirements for the scenario tests), shared with ./build.sh.
# Extra arguments go to pytest, e.g.  ci/test.sh -k bug_a
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/venv.sh
. ci/venv.sh
ensure_venv ci/requirements-build.txt ci/requirements-test.txt
"$VENV_PY" -m tpfix.replay.deps

echo "==> lint: ruff (scripts, tests), shellcheck"
"$VENV_PY" -m ruff check scripts tests
"$VENV_PY" -m ruff format --check scripts tests
if command -v shellcheck >/dev/null; then
    shellcheck build.sh ci/*.sh .ci/run
else
    echo "error: shellcheck not found; install it (Debian: apt-get install shellcheck)" >&2
    exit 2
fi

echo "==> pytest"
exec "$VENV_PY" -m pytest tests "$@"
