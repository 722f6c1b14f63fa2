# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Reports on a built release, run after a build: known advisories and our VEX
(advisories), the SBOM as resolved for the reference platform
(resolved_sbom; resolution: the uv resolution both use) and the README's
support matrix from the lines' pins (support_matrix)."""
