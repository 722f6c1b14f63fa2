# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The build stages, in pipeline order: fetch (pins into the sha256 cache),
patch (the series onto the sdist, quilt), build (setup.py, precompiled
kernels), verify (against the official wheel), package (SBOM, provenance,
index, publish into dist/), with wheel_cache (a rebuild with nothing
changed).  tpfix.pipeline runs them in order."""
