# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The shared core every part of tpfix uses: the release lines and their pins
(lines), one build's inputs resolved once (context), patch and series files
(patch_format, quilt), a wheel's files (wheelfile), the build locks (worklock)
and errors, hashing, the cache and child processes (util).  It imports
nothing of tpfix outside core/."""
