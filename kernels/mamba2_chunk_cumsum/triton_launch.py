"""Turning a (config, shape) of the chunk-cumsum template into a launch closure ``fn(inputs, outputs)``.

Everything that does not depend on the tensors (constexprs, grid, launch options) is computed once here;
the closure only gathers pointers (and, for the TMA layout, host-side tensor descriptors, which are plain
structs passed by value: no device allocation) and launches. No host synchronisation, no copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.frozen import Config, Shape
from tuner.template import Kernel, Tensors

LAYOUTS = {"rows": 1, "tma": 2}  # values of the kernel's LAYOUT constexpr
SWEEPS = ("chunks", "heads")
PARAMS = ("layout", "sweep", "BLOCK_H", "CHUNKS", "SPLIT", "persistent", "hints", "num_warps", "num_stages")


@dataclass(frozen=True)
class LaunchPlan:
    """The constexprs, grid and options of one build. Immutable."""

    constexprs: dict[str, Any]
    grid: tuple[int]
    num_warps: int
    num_stages: int
    tma: bool
    # TMA box shapes: dt viewed as (B, S/Q, Q, H), outputs as (B, H, S/Q, Q)
    in_box: tuple[int, int, int, int]
    out_box: tuple[int, int, int, int]


def plan(config: Config, shape: Shape, sm_count: int) -> LaunchPlan:
    """Validate the config's values and derive the launch; ConfigError names a bad or missing parameter."""
    missing = [p for p in PARAMS if p not in config]
    if missing:
        raise ConfigError(f"missing parameter(s) {', '.join(missing)}")
    layout, sweep = str(config["layout"]), str(config["sweep"])
    if layout not in LAYOUTS or sweep not in SWEEPS:
        raise ConfigError(f"layout {layout!r} / sweep {sweep!r}: expected {tuple(LAYOUTS)} / {SWEEPS}")
    block_h, chunks, split = (int(config[p]) for p in ("BLOCK_H", "CHUNKS", "SPLIT"))
    b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
    for name, v in (("BLOCK_H", block_h), ("CHUNKS", chunks), ("SPLIT", split)):
        if v < 1 or v & (v - 1):
            raise ConfigError(f"{name} must be a power of two, got {v}")
    if (s // q) % chunks or q % split or q // split < 2:
        raise ConfigError(f"CHUNKS={chunks} / SPLIT={split} do not fit S={s}, Q={q}")
    sub_q = q // split
    tiles = b * (s // q // chunks) * -(-h // block_h)
    persistent = int(config["persistent"])
    grid = (min(tiles, persistent * sm_count),) if persistent > 0 else (tiles,)
    constexprs = dict(
        B=b, S=s, H=h, Q=q, BLOCK_H=block_h, CHUNKS=chunks, SUB_Q=sub_q,
        HAS_BIAS=bool(shape["has_bias"]), SOFTPLUS=bool(shape["softplus"]), LAYOUT=LAYOUTS[layout],
        SWEEP_HEADS=sweep == "heads", PERSISTENT=persistent > 0, NUM_STAGES=int(config["num_stages"]),
        HINTS=bool(config["hints"]),
    )
    return LaunchPlan(
        constexprs=constexprs, grid=grid, num_warps=int(config["num_warps"]),
        num_stages=int(config["num_stages"]), tma=layout == "tma",
        in_box=(1, chunks, sub_q, block_h), out_box=(1, block_h, chunks, sub_q),
    )


def make_launch(config: Config, shape: Shape, sm_count: int) -> Kernel:
    """The kernel closure. Inputs/outputs must be the template's contiguous tensors of this shape."""
    from tuner.kernels.mamba2_chunk_cumsum.triton_kernel import chunk_cumsum_kernel

    p = plan(config, shape, sm_count)
    launcher = chunk_cumsum_kernel[p.grid]
    opts = dict(p.constexprs, num_warps=p.num_warps, num_stages=p.num_stages)
    b, s, h, q = (int(shape[d]) for d in ("B", "S", "H", "Q"))
    nc = s // q

    if not p.tma:

        def fn(inputs: Tensors, outputs: Tensors) -> None:
            launcher(inputs["dt"], inputs["A"], inputs.get("dt_bias"), inputs["dt_limit"],
                     outputs["dt_out"], outputs["dA_cumsum"], **opts)

        return fn

    from triton.tools.tensor_descriptor import TensorDescriptor

    in_shape, in_strides = [b, nc, q, h], [s * h, q * h, h, 1]
    out_shape, out_strides = [b, h, nc, q], [h * nc * q, nc * q, q, 1]

    def fn_tma(inputs: Tensors, outputs: Tensors) -> None:
        dt = TensorDescriptor(inputs["dt"], in_shape, in_strides, list(p.in_box))
        out = TensorDescriptor(outputs["dt_out"], out_shape, out_strides, list(p.out_box))
        da = TensorDescriptor(outputs["dA_cumsum"], out_shape, out_strides, list(p.out_box))
        launcher(dt, inputs["A"], inputs.get("dt_bias"), inputs["dt_limit"], out, da, **opts)

    return fn_tma
