# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Scenario replays: real vLLM code of a patched tree on a simulated device layer."""
