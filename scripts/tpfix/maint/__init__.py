# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Maintainer tools: the quilt workflow, rebase onto a new tag, upstream export."""
