"""The chunk cumsum's measured memory ceiling: an elementwise kernel moving the template's minimum bytes.

A device-to-device copy (``dst.copy_(src)``, the fingerprint's copy bandwidth) runs on the copy path and is no
kernel's ceiling: on the H200 an elementwise kernel reading and writing 2p7b's 52.4 MB under the same L2 flush
took 14.59 µs where the memcpy figure was ~16.5 µs (measuring.md). This kernel reads ``dt`` (fp32) once and
writes both outputs, ``dA_cumsum`` (fp32) and ``dt_out`` (the shape's dtype), element for element in one flat
pass: exactly the template's bytes (:meth:`Mamba2ChunkCumsumOp.bytes_moved`, less the few bytes of ``A`` and
``dt_bias``), with none of its math, its transposition or its scan. Its outputs are not the operator's (a
copy, not the cumsum), so its lines are ungated; reports use the best of them as the roofline ceiling and
never as a competitor.

Members differ in elements per program (BLOCK, 4 warps): the report takes the fastest, so the ceiling does
not hinge on one launch configuration. Triton is imported lazily (the template module imports without it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.frozen import Shape
from tuner.template import Comparator, Kernel, Tensors

BLOCKS = (512, 1024, 2048, 4096)
NUM_WARPS = 4
GROUP = "elementwise kernel of the same bytes"

_kernel: Any = None


def _compiled() -> Any:
    """The Triton JIT function, defined at first use."""
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def elementwise_ceiling(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(y_ptr + offs, x, mask=mask)
            tl.store(z_ptr + offs, x.to(z_ptr.dtype.element_ty), mask=mask)

        _kernel = elementwise_ceiling
    return _kernel


def unavailable(shape: Shape) -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton not importable: {exc}"
    return None


def build(block: int) -> Callable[[Shape], Kernel]:
    def make(shape: Shape) -> Kernel:
        import triton

        kernel = _compiled()
        n = int(shape["B"]) * int(shape["S"]) * int(shape["H"])
        grid = (triton.cdiv(n, block),)

        def fn(inputs: Tensors, outputs: Tensors) -> None:
            kernel[grid](inputs["dt"], outputs["dA_cumsum"], outputs["dt_out"], n, BLOCK=block, num_warps=NUM_WARPS)

        return fn

    return make


def comparators() -> tuple[Comparator, ...]:
    return tuple(
        Comparator(
            name=f"ceiling-block{block}",
            doc=f"elementwise Triton kernel, {block} elements per program: reads dt (fp32), writes dA_cumsum "
                "(fp32) and dt_out (the shape's dtype) flat, no math: the template's minimum bytes",
            build=build(block),
            unavailable=unavailable,
            group=GROUP,
            gated=False,
            ceiling=True,
        )
        for block in BLOCKS
    )
