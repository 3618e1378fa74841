"""mamba_ssm's chunk-cumsum forward as comparators of the chunk-cumsum template: as users call it, and
contract variants.

mamba_ssm 2.3.2.post1 (mamba_ssm/ops/triton/ssd_chunk_state.py) wraps ``_chunk_cumsum_fwd_kernel`` in
``@triton.autotune`` over BLOCK_SIZE_H ∈ {1, …, 64} (triton.Config defaults: 4 warps, 3 stages), keyed on
(chunk_size, nheads) and the arguments' dtypes. Its Python wrapper ``_chunk_cumsum_fwd`` allocates fp32
``dt_out`` and ``dA_cumsum`` and returns them: users get fp32 ``dt_out`` whatever the model's dtype, so
its contract is the template's at ``dtype=float32`` (12 bytes per element moved instead of 10).

Lines as users call it (contract ``dtype=float32``):
- ``mamba_ssm-wrapper``: ``_chunk_cumsum_fwd`` itself, its own outputs, its autotuner (which benchmarks its
  configs at the first call with a new key: the measurer's check run, before any timing).
- ``mamba_ssm-fp32-bh{1,2,4,8,16}``: the autotuner's JIT function at a fixed BLOCK_SIZE_H (4 warps, 3
  stages), launched exactly as the wrapper launches it, on fp32 outputs (the wrapper's dtype): what the
  wrapper runs once its autotuner has picked that config. Reports show the best of them.

Contract variants (the TileOPs contract: the kernel launched on our fp16/bf16 ``dt_out`` buffers;
``tl.store`` casts to the pointee type, so no extra kernel runs, but Triton specialises the kernel anew):
``mamba_ssm-tileops`` (autotuned) and ``mamba_ssm-tileops-bh{n}``. On the H200 these ran 5–7% slower than
the wrapper's fp32 specialisation although they move fewer bytes (measuring.md, 2026-12-01).

mamba_ssm is imported lazily: it is not installed everywhere, and importing it imports Triton.

dt_min/dt_max are kernel *scalars* in mamba_ssm but a device tensor in our inputs. Each built kernel reads
them once per limits tensor (one device→host copy, at the first call with that tensor, i.e. the check or
the warm-up) and keeps them keyed by the tensor's identity and version, so timed calls never synchronise.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tuner.frozen import Shape
from tuner.template import Comparator, Kernel, Tensors

MODULE = "mamba_ssm.ops.triton.ssd_chunk_state"
KERNEL = "_chunk_cumsum_fwd_kernel"
WRAPPER = "_chunk_cumsum_fwd"
USER_CONTRACT = {"dtype": "float32"}  # the wrapper's outputs are fp32
FIXED_BLOCK_H = (1, 2, 4, 8, 16)
AUTOTUNE_NUM_WARPS = 4  # triton.Config defaults, which mamba_ssm's configs keep
AUTOTUNE_NUM_STAGES = 3


def _load_kernel() -> Any:
    """The autotuned kernel object; ImportError/AttributeError when mamba_ssm is missing or changed."""
    return getattr(importlib.import_module(MODULE), KERNEL)


def unavailable(shape: Shape) -> str | None:
    """Why the comparators cannot run here, or None."""
    try:
        _load_kernel()
    except Exception as exc:  # any import failure (missing package, CUDA extension, Triton mismatch)
        return f"mamba_ssm not importable: {type(exc).__name__}: {exc}"
    return None


class _HostLimits:
    """Host copies of dt_limit tensors, keyed by tensor identity and version (see the module doc)."""

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self._cache: Any = WeakIdKeyDictionary()

    def get(self, limit: Any) -> tuple[float, float]:
        hit = self._cache.get(limit)
        if hit is not None and hit[0] == limit._version:
            return hit[1]
        lo, hi = (float(v) for v in limit.tolist())
        self._cache[limit] = (limit._version, (lo, hi))
        return lo, hi


def _launcher(shape: Shape, kernel: Any, extra: dict[str, Any]) -> Kernel:
    """fn(inputs, outputs) launching ``kernel`` (autotuner or JIT function) as _chunk_cumsum_fwd does."""
    import triton

    b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
    nchunks = s // q
    grid = lambda meta: (b, nchunks, triton.cdiv(h, meta["BLOCK_SIZE_H"]))
    limits = _HostLimits()
    has_bias, softplus = bool(shape["has_bias"]), bool(shape["softplus"])

    def fn(inputs: Tensors, outputs: Tensors) -> None:
        dt, a, bias = inputs["dt"], inputs["A"], inputs.get("dt_bias")
        out, da = outputs["dt_out"], outputs["dA_cumsum"]
        dt_min, dt_max = limits.get(inputs["dt_limit"])
        kernel[grid](
            dt, a, bias, out, da,
            b, s, h, q,
            dt_min, dt_max,
            dt.stride(0), dt.stride(1), dt.stride(2),
            a.stride(0),
            bias.stride(0) if bias is not None else 0,
            out.stride(0), out.stride(2), out.stride(1), out.stride(3),
            da.stride(0), da.stride(2), da.stride(1), da.stride(3),
            softplus,
            HAS_DT_BIAS=has_bias,
            BLOCK_SIZE_CHUNK=triton.next_power_of_2(q),
            **extra,
        )

    return fn


def _jit_function(kernel: Any) -> Any:
    """The JIT function (an InterpretedFunction under the interpreter) under autotune/heuristics wrappers."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    while isinstance(kernel, (Autotuner, Heuristics)):
        kernel = kernel.fn
    return kernel


def build_autotuned(shape: Shape) -> Kernel:
    return _launcher(shape, _load_kernel(), {})


def build_wrapper(shape: Shape) -> Kernel:
    """fn(inputs, outputs) calling ``_chunk_cumsum_fwd`` as a user does; returns its own outputs."""
    wrapper = getattr(importlib.import_module(MODULE), WRAPPER)
    q, softplus = int(shape["Q"]), bool(shape["softplus"])
    limits = _HostLimits()

    def fn(inputs: Tensors, outputs: Tensors) -> dict[str, Any]:
        dt_limit = limits.get(inputs["dt_limit"])  # users pass a tuple of floats
        da, out = wrapper(inputs["dt"], inputs["A"], q, dt_bias=inputs.get("dt_bias"), dt_softplus=softplus,
                          dt_limit=dt_limit)
        return {"dt_out": out, "dA_cumsum": da}

    return fn


def build_fixed(block_h: int) -> Callable[[Shape], Kernel]:
    def build(shape: Shape) -> Kernel:
        extra = dict(BLOCK_SIZE_H=block_h, num_warps=AUTOTUNE_NUM_WARPS, num_stages=AUTOTUNE_NUM_STAGES)
        return _launcher(shape, _jit_function(_load_kernel()), extra)

    return build


USER_AUTOTUNED = "mamba_ssm autotuned"
USER_FIXED = "mamba_ssm best BLOCK_SIZE_H"
VARIANT_AUTOTUNED = "variant mamba_ssm autotuned on our dt_out"
VARIANT_FIXED = "variant mamba_ssm best BLOCK_SIZE_H on our dt_out"
VARIANT = "mamba_ssm's kernel launched on the template's output buffers (dt_out in the shape's dtype)"


def comparators() -> tuple[Comparator, ...]:
    """The lines as users call mamba_ssm (fp32 outputs), then the TileOPs-contract variants."""
    user = {"unavailable": unavailable, "contract": USER_CONTRACT}
    variant = {"unavailable": unavailable, "variant": VARIANT}
    return (
        Comparator("mamba_ssm-wrapper", "mamba_ssm 2.3.x _chunk_cumsum_fwd as users call it: its wrapper, its fp32 "
                   "outputs, its autotuner", build_wrapper, group=USER_AUTOTUNED, **user),  # type: ignore[arg-type]
        *_fixed_lines("mamba_ssm-fp32", "on fp32 outputs as its wrapper launches it", USER_FIXED, user),
        Comparator("mamba_ssm-tileops", "mamba_ssm 2.3.x _chunk_cumsum_fwd_kernel with its own autotuning, on our "
                   "output buffers", build_autotuned, group=VARIANT_AUTOTUNED, **variant),  # type: ignore[arg-type]
        *_fixed_lines("mamba_ssm-tileops", "on our output buffers", VARIANT_FIXED, variant),
    )


def _fixed_lines(prefix: str, where: str, group: str, extra: dict[str, Any]) -> list[Comparator]:
    """One comparator per fixed BLOCK_SIZE_H, ``<prefix>-bh<n>``, in one group."""
    return [
        Comparator(f"{prefix}-bh{bh}", f"mamba_ssm's kernel at BLOCK_SIZE_H={bh}, {AUTOTUNE_NUM_WARPS} warps, {where}",
                   build_fixed(bh), group=group, **extra)
        for bh in FIXED_BLOCK_H
    ]
