# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The container image (./build.sh --image, python -m tpfix.image): the
image of each arch (image), the engine (image_engine), what runs inside the
image build (image_inside), the manifest list over the arches (image_list)
and the image's SBOM (image_sbom)."""
