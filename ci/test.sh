#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# The test command: lint, then the pytest suite in two tiers, each test once:
# the fast tier (-m "not slow": series checks, each bug's scenario replays),
# then the slow one (-m slow: real builds, the image, the sweeps).  Both run
# even when the first fails; the command fails when either does.
# Sets up build/venv (the build's, the replays' and the tests' locked
# requirements: ci/*.lock, tpfix.maint.lock), shared with ./build.sh.
# Each tier runs on pytest-xdist workers, one per core (at most 4): a file
# whose tests share module fixtures runs on one worker (tests/conftest.py's
# ONE_WORKER, which replaces xdist's scheduler; see docs/developing.md).
# Extra arguments go to pytest in both tiers, e.g.  ci/test.sh -k bug_a, or
# -n 0 for one process (a -m of your own replaces the tiers: one pytest run
# with your selection).
set -euo pipefail
cd "$(dirname "$0")/.."

# System tools, checked before anything is installed (README: prerequisites).
missing=()
for tool in quilt shellcheck buildah mmdebstrap git; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "error: not found on PATH: ${missing[*]}" >&2
    echo "  install (Debian/Ubuntu): apt-get install ${missing[*]}" >&2
    echo "  (quilt: the series; shellcheck: lint; buildah + mmdebstrap: the image" \
        "tests, tests/test_image.py; git: the forward-port tests)" >&2
    exit 2
fi
emulator=$(ci/emulator.sh)
if ! grep -qx enabled "/proc/sys/fs/binfmt_misc/$emulator" 2>/dev/null; then
    echo "error: /proc/sys/fs/binfmt_misc/$emulator is not enabled: the other arch's" \
        "image (tests/test_image_arches.py) runs its base's python3 under qemu" >&2
    echo "  install (Debian/Ubuntu): apt-get install qemu-user-static binfmt-support" \
        "(in a container first: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc)" >&2
    exit 2
fi
# Python 3.11 exactly: bug C (tests/test_bug_c.py) exists only before 3.12,
# and the build needs >= 3.11.  The venv's Python, or the one it would be made with.
py=build/venv/bin/python
[ -x "$py" ] || py=${PYTHON:-python3}
if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "error: the test suite needs Python 3.11 (bug C only exists before 3.12);" \
        "\`$py\` is $("$py" -V 2>&1 || echo missing)" >&2
    echo "  install python3.11 (Debian 12's python3) and run: rm -rf build/venv;" \
        "PYTHON=python3.11 ci/test.sh" >&2
    exit 2
fi

# shellcheck source=ci/venv.sh
. ci/venv.sh
ensure_venv ci/requirements-build.lock ci/requirements-replay.lock ci/requirements-test.lock

echo "==> lint: ruff (scripts, tests), shellcheck"
"$VENV_PY" -m ruff check scripts tests
"$VENV_PY" -m ruff format --check scripts tests
shellcheck build.sh ci/*.sh .ci/run

workers=(-n auto --maxprocesses 4 --dist loadscope)
for arg in "$@"; do
    case $arg in
    -m | -m* | --markexpr | --markexpr=*)
        echo "==> pytest (your own -m)"
        exec "$VENV_PY" -m pytest "${workers[@]}" "$@"
        ;;
    esac
done

# pytest exits 5 when it selects no test: fine in one tier (say, -k matching
# only slow tests), an error when neither tier has any.
tier() {
    local name=$1 expr=$2 rc=0
    shift 2
    echo "==> pytest: $name tier (-m \"$expr\")"
    # --durations: the slowest tests, to keep CI's time in view
    "$VENV_PY" -m pytest -m "$expr" "${workers[@]}" --durations=15 "$@" || rc=$?
    return "$rc"
}
fast=0 slow=0
tier fast "not slow" "$@" || fast=$?
tier slow "slow" "$@" || slow=$?
echo "==> pytest: fast tier exit $fast, slow tier exit $slow (5: no test selected)"
if [ "$fast" -eq 5 ] && [ "$slow" -eq 5 ]; then
    echo "error: no test selected in either tier" >&2
    exit 5
fi
for rc in "$fast" "$slow"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        exit "$rc"
    fi
done
