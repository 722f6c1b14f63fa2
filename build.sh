#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# Build the patched vLLM wheel into dist/:
#   fetch -> verify -> patch -> build -> verify -> package   (scripts/tpfix/pipeline.py)
# Options: --arch x86_64|aarch64, --dist DIR, --no-cache (see scripts/tpfix/pipeline.py);
# --line TAG: another release line (patches/TAG/); --image: then the container image
# from that wheel (Dockerfile, scripts/tpfix/image/image.py).
# ./build.sh doctor [...] -- vllm serve ...: preflight of a serve line (scripts/tpfix/preflight/doctor.py).
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=ci/venv.sh
. ci/venv.sh
ensure_venv ci/requirements-build.lock
case "${1:-}" in
doctor)
    shift
    # the replays import vLLM from source trees and FlashInfer: their
    # runtime requirements (every line's requirements/common.txt), once
    ensure_venv ci/requirements-replay.lock
    exec "$VENV_PY" -m tpfix.preflight.doctor "$@"
    ;;
esac
exec "$VENV_PY" -m tpfix.pipeline "$@"
