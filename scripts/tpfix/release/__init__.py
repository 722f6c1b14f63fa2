# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What a release ships beside the wheel: the SBOMs (sbom, wheel_sbom; a
line's advisory triage: triage), the provenance and its signatures (attest;
dist_verify, copied into dist/ as verify.py) and the package index (index).
The package stage writes them; they import only core/."""
