"""mamba_ssm's chunk-cumsum forward kernel as comparators of the chunk-cumsum template.

mamba_ssm 2.3.2.post1 (mamba_ssm/ops/triton/ssd_chunk_state.py) wraps ``_chunk_cumsum_fwd_kernel`` in
``@triton.autotune`` over BLOCK_SIZE_H ∈ {1, …, 64} (triton.Config defaults: 4 warps, 3 stages), keyed on
(chunk_size, nheads). Its Python wrapper allocates fp32 outputs; the kernel itself stores dt_out through
a pointer (tl.store casts to the pointee type), so launching it on our fp16/bf16 ``dt_out`` buffer gives the
TileOPs contract with no extra kernel. Strides are passed in the wrapper's order (chunk before head).

Lines: ``mamba_ssm`` (its autotuner, which benchmarks its configs at the first call: the measurer's warm-up)
and ``mamba_ssm-bh{1,2,4,8,16}`` (the autotuner's JIT function at a fixed BLOCK_SIZE_H, 4 warps, 3 stages).
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


def build_fixed(block_h: int) -> Callable[[Shape], Kernel]:
    def build(shape: Shape) -> Kernel:
        extra = dict(BLOCK_SIZE_H=block_h, num_warps=AUTOTUNE_NUM_WARPS, num_stages=AUTOTUNE_NUM_STAGES)
        return _launcher(shape, _jit_function(_load_kernel()), extra)

    return build


def comparators() -> tuple[Comparator, ...]:
    lines = [
        Comparator(
            name="mamba_ssm",
            doc="mamba_ssm 2.3.x _chunk_cumsum_fwd_kernel with its own autotuning, on our output buffers",
            build=build_autotuned,
            unavailable=unavailable,
        )
    ]
    for bh in FIXED_BLOCK_H:
        lines.append(
            Comparator(
                name=f"mamba_ssm-bh{bh}",
                doc=f"mamba_ssm's kernel at BLOCK_SIZE_H={bh}, {AUTOTUNE_NUM_WARPS} warps (no autotuning)",
                build=build_fixed(bh),
                unavailable=unavailable,
                group="mamba_ssm best fixed BLOCK_SIZE_H",
            )
        )
    return tuple(lines)
