#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The CUDA allocation granularities that round FlashInfer's MNNVL workspace.

GPU check, one GPU is enough, no FlashInfer needed (only cuda-bindings, the
`cuda.bindings.driver` module).  FlashInfer's MNNVL workspace (mnnvl.py,
McastGPUBuffer / _get_allocation_prop) rounds each rank's allocation, the
requested Lamport buffers plus a signal pad, up to the device's *recommended*
allocation granularity for a pinned device allocation with the exchange's
handle type (POSIX file descriptor on one node, FABRIC across nodes) and
gpuDirectRDMACapable set, then, with multicast, up to the multicast
granularity.  The usable buffer is what that rounding leaves.  So whether a
workspace that is a few bytes short at granularity 1 (the replays' worst
case) is short on a real device depends on these numbers.  This prints them
as JSON, for the handle types this device accepts:

    python3 scripts/tpfix/bench/granularity_gpu.py [--devices 8]

--devices: the group size asked of the multicast granularity (a multicast
object spans the TP group); it is answered only where the device supports
multicast (NVSwitch), else the error is printed.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    args = ap.parse_args()
    from cuda.bindings import driver as cu

    def call(fn, *a):
        res = fn(*a)
        err, rest = res[0], res[1:]
        if err != cu.CUresult.CUDA_SUCCESS:
            return None, cu.cuGetErrorName(err)[1].decode()
        return (rest[0] if len(rest) == 1 else rest), None

    call(cu.cuInit, 0)
    dev, _ = call(cu.cuDeviceGet, 0)
    name, _ = call(cu.cuDeviceGetName, 128, dev)
    out: dict = {"device": name.split(b"\0")[0].decode() if name else None}
    attr = cu.CUdevice_attribute
    for key, a in (
        ("multicast_supported", attr.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED),
        ("fabric_handle_supported", attr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED),
        ("compute_capability_major", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
    ):
        out[key], err = call(cu.cuDeviceGetAttribute, a, dev)
        if err:
            out[key] = err
    ctx, _ = call(cu.cuDevicePrimaryCtxRetain, dev)
    call(cu.cuCtxSetCurrent, ctx)
    handles = cu.CUmemAllocationHandleType
    flags = cu.CUmemAllocationGranularity_flags
    for label, handle in (
        ("posix_fd", handles.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        ("fabric", handles.CU_MEM_HANDLE_TYPE_FABRIC),
    ):
        prop = cu.CUmemAllocationProp()
        prop.requestedHandleTypes = handle
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = cu.CUmemLocation()
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        prop.allocFlags.gpuDirectRDMACapable = 1
        entry = {}
        for kind, flag in (
            ("minimum", flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            ("recommended", flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        ):
            value, err = call(cu.cuMemGetAllocationGranularity, prop, flag)
            entry[kind] = value if err is None else err
        mc = cu.CUmulticastObjectProp()
        mc.numDevices = args.devices
        mc.size = 2 << 20
        mc.handleTypes = handle
        value, err = call(
            cu.cuMulticastGetGranularity,
            mc,
            cu.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_RECOMMENDED,
        )
        entry["multicast_recommended"] = value if err is None else err
        out[label] = entry
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
