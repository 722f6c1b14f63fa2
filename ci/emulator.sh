#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# The binfmt_misc entry (qemu-user-static) that runs the other official
# arch's binaries on this host, as tpfix.image.image_engine.check_platform reads
# it: the image of that arch runs its base's python3 in the build.
case $(uname -m) in
x86_64) echo qemu-aarch64 ;;
aarch64) echo qemu-x86_64 ;;
*)
    echo "error: $(uname -m) is not an official arch (x86_64, aarch64)" >&2
    exit 2
    ;;
esac
