# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# The official vLLM image with the patched wheel of this distribution in place
# of vLLM's own, and nothing else changed (same entrypoint, environment, user,
# working directory; same Python environment except what the series re-pins).
#
# Build it with  ./build.sh --image  (or python -m tpfix.image once dist/ holds the
# wheel): scripts/tpfix/image/image.py stages the build context under build/dists/ (outside dist/):
#   dist/<wheel> + dist/SHA256SUMS   the wheel ./build.sh produced, and its line
#                                     of dist/SHA256SUMS (the only entry copied)
#   wheels/*.whl + wheels/SHA256SUMS  requirements the series re-pins (from pins/)
#   image_inside.py                   the steps below (scripts/tpfix/image/image_inside.py)
# and passes the labels' values.  Reproducible: it also passes one fixed
# SOURCE_DATE_EPOCH (buildah --timestamp, BuildKit's SOURCE_DATE_EPOCH build
# argument), so two builds of one commit give the same layer and config.
# See docs/image.md.
# No defaults for the base and the tag: python -m tpfix.image passes the line's
# (vllm/vllm-openai:<tag>), so that VERSION stays the one place naming a tag.
ARG BASE_IMAGE

# Builder: pip install --no-deps our wheel (and the re-pins) over the base, as a
# user would, then keep only the files whose bytes differ from the base's and
# the list of paths pip removed.  Checks the wheel against SHA256SUMS first.
FROM ${BASE_IMAGE} AS builder
ARG PYTHON=python3
ARG VERSION=""
# FlashInfer's wheel index, the one vLLM's own docker/Dockerfile uses: needed
# only when the base ships flashinfer-cubin / flashinfer-jit-cache, which must
# be upgraded together with flashinfer-python (they are not on PyPI).
ARG FLASHINFER_INDEX_URL=""
RUN --mount=type=bind,source=.,target=/ctx \
    ${PYTHON} -B /ctx/image_inside.py stage --ctx /ctx --out /delta \
        --version "${VERSION}" --flashinfer-index "${FLASHINFER_INDEX_URL}"

# Final: the base plus one layer holding only that difference, verified against
# the wheel's RECORD, the builder's pip install and the base's pip check.
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG PYTHON=python3
ARG VERSION=""
ARG REVISION=unknown
ARG SOURCE=""
ARG UPSTREAM_TAG
ARG SERIES=""
ARG SERIES_SHA256=""
ARG WHEEL_SHA256=""
RUN --mount=type=bind,source=.,target=/ctx \
    --mount=type=bind,from=builder,source=/delta,target=/delta \
    ${PYTHON} -B /ctx/image_inside.py apply --ctx /ctx --delta /delta
LABEL org.opencontainers.image.title="vLLM ${UPSTREAM_TAG} + tpfix" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      tpfix.upstream.tag="${UPSTREAM_TAG}" \
      tpfix.series="${SERIES}" \
      tpfix.series.sha256="${SERIES_SHA256}" \
      tpfix.wheel.sha256="${WHEEL_SHA256}"
