# shellcheck shell=bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# Sourced by build.sh and ci/test.sh: make (or update) build/venv from the
# lock files given as arguments (ci/*.lock: exact versions with their sha256,
# complete: every requirement of every locked package is itself locked;
# python -m tpfix.maint.lock writes them), and check the tools the pipeline needs.

# The oldest pip this supports: CPython 3.11.7's bundled pip, what
# `python3 -m venv` puts in a new venv.  Nothing here needs a newer one.
MIN_PIP=23.2.1

# install_lock PYTHON LOCK LOG: install exactly what LOCK names into PYTHON's
# environment, resolving nothing against the index.  A lock is a complete,
# hash-checked set, so pip installs it --no-deps (pip's documented way for
# such files): with dependency resolution on, pip before 23.3 looks a locked
# package's extra (CacheControl[filecache] of pip-audit) up on the index as a
# requirement of its own, takes the newest release there and stops on its
# missing hash, so any later upload could break the install.  `pip check`
# then proves the set consistent.  tests/test_lock.py runs this function.
install_lock() {
    local py=$1 lock=$2 log=$3
    local pip
    pip=$("$py" -m pip --version 2>/dev/null | cut -d' ' -f2)
    if [ -z "$pip" ] || [ "$(printf '%s\n' "$MIN_PIP" "$pip" | sort -V | head -n1)" != "$MIN_PIP" ]; then
        echo "error: $py has pip ${pip:-none}; the locks need pip >= $MIN_PIP:" \
            "$py -m pip install 'pip>=$MIN_PIP'" >&2
        return 2
    fi
    # --no-compile: Python compiles what it imports, when it does; compiling
    # every file at install (torch's thousands) cost 11 s of the replay lock's 59.
    if ! "$py" -m pip install --disable-pip-version-check --no-compile --no-deps \
        --require-hashes -r "$lock" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "error: pip could not install $lock into $("$py" -c 'import sys; print(sys.prefix)') (log above)" >&2
        if grep -q "torch==2.13.0+cpu" "$log"; then
            echo "  the locks take PyTorch's CPU build, torch 2.13.0+cpu: let pip" \
                "find it (PIP_FIND_LINKS=<folder with its wheel>, or" \
                "PIP_EXTRA_INDEX_URL=<PyTorch's CPU wheel index>)" >&2
        fi
        return 2
    fi
    if ! "$py" -m pip check --disable-pip-version-check >>"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "error: $lock installed, but pip check finds a requirement it does not meet" \
            "(log above): the lock is incomplete; run python -m tpfix.maint.lock" >&2
        return 2
    fi
}

ensure_venv() {
    local root venv py
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    venv="$root/build/venv"
    py=${PYTHON:-python3}
    # the locks (ci/*.lock) are resolved for CPython 3.11 on x86_64 Linux
    if ! "$py" -c 'import platform, sys
sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64")' 2>/dev/null; then
        echo "error: build/venv is made from locks for CPython 3.11 on x86_64;" \
            "\`$py\` is $("$py" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())' 2>/dev/null || echo missing)" >&2
        echo "  install python3.11 (Debian 12's python3) and run: rm -rf build/venv;" \
            "PYTHON=python3.11 $0" >&2
        return 2
    fi
    if ! command -v quilt >/dev/null; then
        echo "error: \`quilt\` not found on PATH; install it (Debian: apt-get install quilt)" >&2
        return 2
    fi
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv" || return 2
    fi
    # One stamp per requirement file's content: install what is new.
    local f sum
    for f in "$@"; do
        sum=$(sha256sum "$f" | cut -d' ' -f1)
        [ -e "$venv/.installed-$sum" ] && continue
        echo "setting up $venv: $f (log: build/venv-install.log)" >&2
        install_lock "$venv/bin/python" "$f" "$root/build/venv-install.log" || return 2
        touch "$venv/.installed-$sum"
    done
    # This checkout's tooling (the tpfix package in scripts/), editable: once
    # per checkout path, since the link names it.
    sum=$(printf '%s' "$root" | sha256sum | cut -d' ' -f1)
    if [ ! -e "$venv/.tpfix-$sum" ]; then
        if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps \
            --no-build-isolation -e "$root" >"$root/build/venv-install.log" 2>&1; then
            tail -n 20 "$root/build/venv-install.log" >&2
            echo "error: pip could not install $root (scripts/tpfix) into $venv (log above)" >&2
            return 2
        fi
        touch "$venv/.tpfix-$sum"
    fi
    VENV_PY="$venv/bin/python"
    export VENV_PY
}
