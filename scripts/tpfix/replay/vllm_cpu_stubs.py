# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""CPU stand-ins for the ``torch.ops._C`` custom ops that vLLM modules touch
at import time.

What is simulated, and only that: vLLM's compiled extension (``vllm._C``)
cannot load on a host without the CUDA driver, so the ops it would register
are missing.  A few vLLM modules look those ops up while being imported
(``vllm/compilation/passes/fusion/matcher_utils.py`` and
``rms_quant_fusion.py`` take ``torch.ops._C.rotary_embedding``, the RMSNorm,
RMSNorm+quant, FP8 quant and ``silu_and_mul`` ops as pattern targets).
This module defines those ops in the ``_C`` namespace with **the same schemas as upstream's
``csrc/libtorch_stable/torch_bindings.cpp``** and gives them plain PyTorch
reference implementations (slow, CPU, no kernel).  An op is only defined
when it is missing, so on a host where ``vllm._C`` loads nothing changes.

No other vLLM code is replaced: the modules that import after this run are
the real ones.

Usage:

* as a module: ``import vllm_cpu_stubs`` (or call :func:`register`);
* as a pytest plugin: put the folder holding this file on ``PYTHONPATH`` and
  run ``pytest -p vllm_cpu_stubs ...``.
"""

from __future__ import annotations

import torch

# name -> schema, copied from csrc/libtorch_stable/torch_bindings.cpp (v0.27.1)
SCHEMAS: dict[str, str] = {
    "rotary_embedding": (
        "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
        "int head_size, Tensor cos_sin_cache, bool is_neox, "
        "int rope_dim_offset=0, bool inverse=False) -> ()"
    ),
    "silu_and_mul": "silu_and_mul(Tensor! result, Tensor input) -> ()",
    "static_scaled_fp8_quant": (
        "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
        "int[]? group_shape=None) -> ()"
    ),
    "dynamic_scaled_fp8_quant": (
        "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()"
    ),
    "dynamic_per_token_scaled_fp8_quant": (
        "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, "
        "Tensor! scale, Tensor? scale_ub) -> ()"
    ),
    "fused_add_rms_norm": (
        "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()"
    ),
    "rms_norm_static_fp8_quant": (
        "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
        "Tensor scale, float epsilon) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
        "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
    "rms_norm_dynamic_per_token_quant": (
        "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, "
        "Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
        "Tensor!? residual) -> ()"
    ),
}

_lib: torch.library.Library | None = None
REGISTERED: list[str] = []


def _fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _rotary_embedding(
    positions,
    query,
    key,
    head_size,
    cos_sin_cache,
    is_neox,
    rope_dim_offset=0,
    inverse=False,
):
    rot_dim = cos_sin_cache.size(-1)
    cos, sin = cos_sin_cache[positions.flatten().long()].float().chunk(2, dim=-1)
    if inverse:
        sin = -sin
    for t in (query, key):
        if t is None:
            continue
        n = positions.numel()
        x = t.view(n, -1, head_size)
        lo, hi = rope_dim_offset, rope_dim_offset + rot_dim
        r = x[..., lo:hi].float()
        c, s = cos[:, None, :], sin[:, None, :]
        if is_neox:
            x1, x2 = r.chunk(2, dim=-1)
            out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        x[..., lo:hi] = out.to(t.dtype)


def _silu_and_mul(result, input):
    d = input.shape[-1] // 2
    result.copy_(torch.nn.functional.silu(input[..., :d]) * input[..., d:])


def _static_scaled_fp8_quant(result, input, scale, group_shape=None):
    m = _fp8_max(result.dtype)
    result.copy_((input.float() / scale.float()).clamp(-m, m).to(result.dtype))


def _dynamic_scaled_fp8_quant(result, input, scale):
    m = _fp8_max(result.dtype)
    scale.fill_(float(input.abs().max().float().clamp(min=1e-12)) / m)
    _static_scaled_fp8_quant(result, input, scale)


def _dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub=None):
    m = _fp8_max(result.dtype)
    amax = input.abs().float().amax(dim=-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float())
    s = (amax / m).clamp(min=1e-12)
    scale.copy_(s.view_as(scale))
    result.copy_((input.float() / s).clamp(-m, m).to(result.dtype))


def _rms(x, weight, epsilon):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        xf = xf.to(weight.dtype) * weight
    return xf.to(x.dtype)


def _fused_add_rms_norm(input, residual, weight, epsilon):
    summed = (input.float() + residual.float()).to(input.dtype)
    residual.copy_(summed)
    input.copy_(_rms(summed, weight, epsilon))


def _rms_norm_static_fp8_quant(result, input, weight, scale, epsilon):
    _static_scaled_fp8_quant(result, _rms(input, weight, epsilon), scale)


def _fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon):
    summed = (input.float() + residual.float()).to(input.dtype)
    residual.copy_(summed)
    _static_scaled_fp8_quant(result, _rms(summed, weight, epsilon), scale)


def _rms_norm_dynamic_per_token_quant(
    result, input, weight, scale, epsilon, scale_ub=None, residual=None
):
    if residual is not None:
        summed = (input.float() + residual.float()).to(input.dtype)
        residual.copy_(summed)
        input = summed
    _dynamic_per_token_scaled_fp8_quant(result, _rms(input, weight, epsilon), scale, scale_ub)


IMPLS = {
    "fused_add_rms_norm": _fused_add_rms_norm,
    "rms_norm_static_fp8_quant": _rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": _fused_add_rms_norm_static_fp8_quant,
    "rms_norm_dynamic_per_token_quant": _rms_norm_dynamic_per_token_quant,
    "rotary_embedding": _rotary_embedding,
    "silu_and_mul": _silu_and_mul,
    "static_scaled_fp8_quant": _static_scaled_fp8_quant,
    "dynamic_scaled_fp8_quant": _dynamic_scaled_fp8_quant,
    "dynamic_per_token_scaled_fp8_quant": _dynamic_per_token_scaled_fp8_quant,
}


def register() -> list[str]:
    """Define the missing ``torch.ops._C`` ops; return the names defined."""
    global _lib
    missing = [n for n in SCHEMAS if not hasattr(torch.ops._C, n)]
    if not missing:
        return []
    if _lib is None:
        _lib = torch.library.Library("_C", "FRAGMENT")
    for name in missing:
        _lib.define(SCHEMAS[name])
        _lib.impl(name, IMPLS[name], "CompositeExplicitAutograd")
        REGISTERED.append(name)
    return missing


register()


def pytest_report_header(config):  # pragma: no cover - pytest hook
    if REGISTERED:
        return "vllm_cpu_stubs: CPU stand-ins for torch.ops._C." + ", ".join(REGISTERED)
    return None


def pytest_configure(config):  # pragma: no cover - pytest hook
    """Upstream's tests/utils.py (multi_gpu_marks) calls
    ``current_platform.device_count()``, which is None on the CPU-only
    "unspecified" platform; report 0 devices so GPU tests skip instead of
    erroring at collection.  Only when used as a pytest plugin."""
    from vllm.platforms import current_platform

    if getattr(current_platform, "device_count", None) is None:
        current_platform.device_count = lambda: 0
