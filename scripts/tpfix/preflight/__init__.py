# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The operator's preflight (./build.sh doctor): a vllm serve line replayed on
the stock and the patched tree (doctor), its report in words (doctor_text)
and the serve line of a deployment file (deployment_file)."""
