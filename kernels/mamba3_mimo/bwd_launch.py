"""Launching the Triton MIMO backward: a plan from (config, shape), scratch buffers, kernel launches.

:func:`run` is the kernel of the template (``fn(inputs, outputs)`` once bound to a plan): it reads the forward
inputs, the saved angle cumsum ``AnglesCS`` and ``dOut``, and writes every gradient in place. Scratch is
allocated per call from torch's caching allocator (no device work); accumulators are zeroed on the device.
Plans are immutable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tuner.frozen import Config, Shape
from tuner.kernels.mamba3_mimo import bwd_kernel as kern
from tuner.settings import triton_interpreted

PRECISIONS = {"lowp": 0, "tf32": 1, "tf32x3": 2, "lowp3": 3}
VARIANTS = ("split", "split2", "grouped", "fused")
STATE_PASSES = ("scan", "walk")
# split2's q/k kernel: its warps as a multiple of num_warps (the value kernel's).
QK_WARPS = {"same": 1.0, "half": 0.5, "double": 2.0}


@dataclass(frozen=True)
class Dims:
    """Problem sizes; A is the number of rotary angles per head (N / rotary divisor)."""

    B: int
    S: int
    H: int
    G: int
    N: int
    P: int
    R: int
    A: int
    lowp: torch.dtype

    @classmethod
    def of(cls, shape: Shape) -> Dims:
        return cls(
            B=int(shape["B"]), S=int(shape["S"]), H=int(shape["H"]), G=int(shape["G"]), N=int(shape["N"]),
            P=int(shape["P"]), R=int(shape["R"]), A=int(shape["N"]) // int(shape["rotary_divisor"]),
            lowp=getattr(torch, str(shape["dtype"])),
        )


@dataclass(frozen=True)
class Plan:
    """A config resolved for launching: variant, chunk size C (steps), matmul precisions, launch settings.

    The config gives ``chunk_rows`` = C·R, the rows of the MIMO chunk tiles (tl.dot needs at least 16), and
    ``block_n``, the rotary pairs per block of the N axis (at least 16, also for tl.dot; padded when N/2 is
    smaller).
    """

    variant: str
    chunk: int
    prec: int
    prec_rot: int
    block_n: int
    num_warps: int
    num_stages: int
    scan_block: int
    scan_chunks: int
    group_chunks: int
    state_pass: str = "scan"
    qk_warps: str = "same"

    @classmethod
    def of(cls, config: Config, dims: Dims) -> Plan:
        """ValueError when the config cannot run on these dims (the search space's constraints say why)."""
        variant = str(config["variant"])
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        rows = int(config["chunk_rows"])
        if rows % dims.R or rows < 16 or dims.S % (rows // dims.R):
            raise ValueError(f"chunk_rows={rows} needs R | chunk_rows, chunk_rows >= 16 and C | S")
        nc = dims.S // (rows // dims.R)
        group = {"split": 1, "split2": 1, "fused": nc}.get(variant, int(config["group_chunks"]))
        if nc % group:
            raise ValueError(f"group_chunks={group} must divide the {nc} chunks")
        state_pass = str(config["state_pass"])
        if state_pass not in STATE_PASSES:
            raise ValueError(f"state_pass must be one of {STATE_PASSES}, got {state_pass!r}")
        if state_pass == "walk" and variant not in ("split", "split2"):
            raise ValueError(f"state_pass=walk needs one-chunk groups (split, split2), not {variant!r}")
        qk_warps = str(config["qk_warps"])
        if qk_warps not in QK_WARPS:
            raise ValueError(f"qk_warps must be one of {tuple(QK_WARPS)}, got {qk_warps!r}")
        if qk_warps != "same" and variant != "split2":
            raise ValueError(f"qk_warps={qk_warps} needs split2 (the only variant with a q/k kernel of its own)")
        return cls(
            variant=variant, chunk=rows // dims.R, prec=PRECISIONS[str(config["prec"])],
            prec_rot=PRECISIONS[str(config["prec_rot"])],
            block_n=int(config["block_n"]), num_warps=int(config["num_warps"]),
            num_stages=int(config["num_stages"]), scan_block=int(config["scan_block"]),
            scan_chunks=int(config["scan_chunks"]), group_chunks=group, state_pass=state_pass, qk_warps=qk_warps,
        )


def _interpret() -> bool:
    return triton_interpreted()


@contextlib.contextmanager
def _mma_sync_only() -> Iterator[None]:
    """Compile (on first launch) with Triton's Hopper wgmma path off: DISABLE_MMA_V3=1 while launching.

    wgmma lowering of these kernels' register-operand dots inside loops produced illegal memory accesses on
    the H200 (N >= 64 split, every fused and grouped config); mma.sync runs them correctly. Triton keys its
    compile cache on this variable, so other kernels compiled without it are unaffected. Not thread-safe
    against Triton compiles in other threads of the process (the environment is process-wide).
    """
    saved = os.environ.get("DISABLE_MMA_V3")
    os.environ["DISABLE_MMA_V3"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["DISABLE_MMA_V3"]
        else:
            os.environ["DISABLE_MMA_V3"] = saved


def _tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


class _Scratch:
    """Per-call buffers: per-step gradients for the epilogue, fp32 accumulators (zeroed in one fill)."""

    def __init__(self, d: Dims, device: torch.device, qk_atomic: bool) -> None:
        f32 = torch.float32
        self.dth = torch.empty(d.B, d.S, d.H, d.A, device=device, dtype=f32)
        self.dfac = torch.empty(d.B, d.H, d.S, device=device, dtype=f32)
        self.dgam = torch.empty(d.B, d.H, d.S, device=device, dtype=f32)
        sizes = [d.H * d.R * d.P] * 3 + [d.H] + [d.H * d.R * d.N] * 2
        if qk_atomic:
            sizes += [d.B * d.S * d.R * d.G * d.N] * 2
        flat = torch.zeros(sum(sizes), device=device, dtype=f32)
        parts = list(torch.split(flat, sizes))
        self.dphi, self.dzeta, self.dpsi, self.dd, self.dqb, self.dkb = parts[:6]
        self.dq = parts[6] if qk_atomic else None
        self.dk = parts[7] if qk_atomic else None


def run(plan: Plan, d: Dims, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
    """Compute every gradient into ``outputs`` (see the module docstring); ValueError on strided outputs."""
    with _mma_sync_only():
        _run(plan, d, inputs, outputs)


def _run(plan: Plan, d: Dims, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
    bad = sorted(k for k, v in outputs.items() if not v.is_contiguous())
    if bad:
        raise ValueError(f"outputs must be contiguous: {', '.join(bad)}")
    t = {k: v.contiguous() for k, v in inputs.items()}
    dev = t["V"].device
    interp = _interpret()
    qk_atomic = d.H // d.G > 1  # the heads of a q/k group add into the same dq/dk rows
    sc = _Scratch(d, dev, qk_atomic)
    dq = sc.dq if qk_atomic else outputs["dQ"]
    dk = sc.dk if qk_atomic else outputs["dK"]
    consts = dict(S=d.S, H=d.H, G=d.G, N=d.N, P=d.P, R=d.R, A=d.A, C=plan.chunk, NB=block_pairs(plan, d),
                  PREC=plan.prec,
                  PREC_ROT=plan.prec_rot, LOWP=_tl_dtype(d.lowp), INTERP=interp)
    launch = dict(num_warps=plan.num_warps, num_stages=plan.num_stages, maxnreg=register_cap(plan.num_warps))
    cos, sin = _rotary_tables(t["AnglesCS"])
    common = (t["Q"], t["K"], t["V"], t["Z"], t["dOut"], t["ADT"], t["DT"], t["Trap"], t["Q_bias"],
              t["K_bias"], t["MIMO_V"], t["MIMO_Z"], t["MIMO_O"], t["D"], cos, sin)
    outs = (outputs["dV"], outputs["dZ"], outputs["dADT"], sc.dth, sc.dfac, sc.dgam, dq, dk,
            sc.dphi, sc.dzeta, sc.dpsi, sc.dd, sc.dqb, sc.dkb)
    _chunk_groups(plan, d, t, common, outs, consts, launch, sc)
    block, segment = epilogue_steps(d.S)
    kern.epilogue_kernel[(d.B * d.H, d.S // segment)](
        t["Angles"], t["DT"], t["Trap"], sc.dth, sc.dfac, sc.dgam, outputs["dAngles"], outputs["dDT"],
        outputs["dTrap"], S=d.S, H=d.H, A=d.A, BT=block, SEG=segment, INTERP=interp, num_warps=8)
    _finish(d, sc, outputs, qk_atomic)


def _rotary_tables(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos = torch.empty_like(angles)
    sin = torch.empty_like(angles)
    n = angles.numel()
    kern.rotary_table_kernel[(triton.cdiv(n, 1024),)](angles, cos, sin, n, BLOCK=1024, num_warps=4)
    return cos, sin


def _only(consts: dict, kernel: object) -> dict:
    """The constants a kernel declares (kernels take different subsets)."""
    names = set(kernel.arg_names)  # type: ignore[attr-defined]
    return {k: v for k, v in consts.items() if k in names}


def _chunk_groups(plan: Plan, d: Dims, t: Mapping[str, torch.Tensor], common: tuple, outs: tuple,
                  consts: dict, launch: dict, sc: _Scratch) -> None:
    """Pass A (each group's own state increments) and the scan when there are several chunk groups, then
    pass C (every gradient: one kernel, or two for split2). One group (fused) needs neither pass A nor the
    scan: its programs start from zero states."""
    dummy = sc.dfac
    gc = plan.group_chunks
    ng = d.S // plan.chunk // gc
    dev = t["V"].device
    buf_h = buf_d = dummy
    if ng > 1 and plan.state_pass == "walk":
        buf_h = torch.empty(d.B, d.H, ng, d.N, d.P, device=dev, dtype=torch.float32)
        buf_d = torch.empty_like(buf_h)
        no_d = tuple(x for i, x in enumerate(common) if i != 13)  # the walk takes no D
        nb, pb = consts["NB"], walk_columns(plan, d)
        grid = (d.B * d.H, triton.cdiv(d.N // 2, nb) * (d.P // pb), 2)
        kern.state_walk_kernel[grid](*no_d, buf_h, buf_d, PB=pb, **_only(consts, kern.state_walk_kernel),
                                     **walk_launch(plan))
    elif ng > 1:
        buf_h = torch.empty(d.B, d.H, ng, d.N, d.P, device=dev, dtype=torch.float32)
        buf_d = torch.empty_like(buf_h)
        decay = torch.empty(d.B, d.H, ng, device=dev, dtype=torch.float32)
        no_d = tuple(x for i, x in enumerate(common) if i != 13)  # group_local_kernel takes no D
        kern.group_local_kernel[(ng, d.B * d.H)](
            *no_d, buf_h, buf_d, decay, GC=gc, **_only(consts, kern.group_local_kernel), **launch)
        np_ = d.N * d.P
        block = min(plan.scan_block, triton.next_power_of_2(np_))
        kern.state_scan_kernel[(d.B * d.H, triton.cdiv(np_, block))](
            buf_h, buf_d, decay, NC=ng, NP=np_, KC=min(plan.scan_chunks, triton.next_power_of_2(ng)),
            BLOCK=block, num_warps=4)
    if plan.variant == "split2":
        _split2(d, t, common, outs, consts, launch, qk_launch(plan), buf_h, buf_d)
        return
    local = dstate = dummy
    if gc > 1:
        local = torch.empty(d.B * d.H * ng * gc * d.N * d.P, device=dev, dtype=torch.float32)
        dstate = torch.empty(d.B * d.H * ng * 2 * d.N * d.P, device=dev, dtype=torch.float32)
    kern.group_bwd_kernel[(ng, d.B * d.H)](*common, buf_h, buf_d, local, dstate, *outs, GC=gc, **consts,
                                           **launch)


def _split2(d: Dims, t: Mapping[str, torch.Tensor], common: tuple, outs: tuple, consts: dict, launch: dict,
            launch_qk: dict, buf_h: torch.Tensor, buf_d: torch.Tensor) -> None:
    """Pass C of split2: the value-side kernel (``launch``), then the q/k-side kernel (``launch_qk``), through
    fp32 scratch of the scores (C*R)², dy (C*R x P) and Σ Hp⊙dH per chunk."""
    nc = d.S // consts["C"]
    rows = consts["C"] * d.R
    dev = t["V"].device
    s_a = torch.empty(d.B * d.H * nc * rows * rows, device=dev, dtype=torch.float32)
    s_dy = torch.empty(d.B * d.H * nc * rows * d.P, device=dev, dtype=torch.float32)
    s_hdh = torch.empty(d.B * d.H * nc, device=dev, dtype=torch.float32)
    (dv, dz, dadt, dth, dfac, dgam, dq, dk, dphi, dzeta, dpsi, dd, dqb, dkb) = outs
    grid = (nc, d.B * d.H)
    kern.chunk_values_kernel[grid](*common, buf_h, buf_d, s_a, s_dy, s_hdh, dv, dz, dphi, dzeta, dpsi, dd,
                                   **_only(consts, kern.chunk_values_kernel), **launch)
    (q, k, v, _z, _dout, adt, dt, trap, qb, kb, mv, _mz, _mo, _d, cos, sin) = common
    kern.chunk_qk_kernel[grid](q, k, v, adt, dt, trap, qb, kb, mv, cos, sin, buf_h, buf_d, s_a, s_dy, s_hdh,
                               dadt, dth, dfac, dgam, dq, dk, dqb, dkb,
                               **_only(consts, kern.chunk_qk_kernel), **launch_qk)


def register_cap(num_warps: int) -> int:
    """The ``.maxnreg`` the chunk kernels are compiled with: the most registers a thread can hold at this
    CTA size (65536 per SM, at most 255).

    Without an explicit cap, ptxas under Triton's ``--regAllocOptLevel=2`` gave some of these kernels 32
    registers and several KB of spills (3-5x slower on the H200; e.g. the default config on N16: 32
    registers and a 7.6 KB stack frame, against 255 registers and 3.1 KB with the cap, ptxas 13.4).
    """
    return min(255, 65536 // (32 * num_warps) // 8 * 8)


def qk_launch(plan: Plan) -> dict:
    """num_warps / num_stages / maxnreg of split2's q/k kernel: ``qk_warps`` times the value kernel's warps
    (at least 1), the register cap of that CTA size (:func:`register_cap`).

    The two kernels hold different tiles: at P = 128 the value kernel needs 4 warps (at 2, 2.5 KB of stack per
    thread, offline sm_90 compile) where the q/k kernel compiles at 2 warps with 128-168 B (2-3 stages)."""
    warps = max(1, int(plan.num_warps * QK_WARPS[plan.qk_warps]))
    return dict(num_warps=warps, num_stages=plan.num_stages, maxnreg=register_cap(warps))


def block_pairs(plan: Plan, d: Dims) -> int:
    """Rotary pairs per N block: block_n, at most N/2, at least 16 (tl.dot's minimum; padded for N=16)."""
    return max(16, min(plan.block_n, d.N // 2))


# Segments of the sequence the epilogue runs in parallel per (b, h) (at most; a divisor of S / its block).
EPILOGUE_SEGMENTS = 16


# Launch settings of the state walk whatever the chunk kernels' (its tiles are small); None: theirs.
WALK_LAUNCH: dict | None = None


def walk_launch(plan: Plan) -> dict:
    """num_warps / num_stages / maxnreg of the state walk (:data:`WALK_LAUNCH`, else the chunk kernels')."""
    if WALK_LAUNCH is not None:
        return dict(WALK_LAUNCH)
    return dict(num_warps=plan.num_warps, num_stages=plan.num_stages, maxnreg=register_cap(plan.num_warps))


def walk_columns(plan: Plan, d: Dims) -> int:
    """Columns of P per program of the state walk: ``scan_block`` / 16 (16 to 128), at most P. The
    walk's programs carry a (2·NB)×PB tile of the state (the scan's carry a ``scan_block`` vector)."""
    return max(16, min(d.P, plan.scan_block // 16))


def epilogue_steps(seqlen: int) -> tuple[int, int]:
    """(BT, SEG) of the epilogue: the time steps of one of its blocks (:func:`epilogue_block`) and of the
    segment one program walks: S split into the most segments, at most :data:`EPILOGUE_SEGMENTS`, of a
    whole number of blocks each (S = 96: 3 segments of one 32-step block; S = 8000: 10 of 25)."""
    block = epilogue_block(seqlen)
    blocks = seqlen // block
    segments = max(k for k in range(1, EPILOGUE_SEGMENTS + 1) if blocks % k == 0)
    return block, seqlen // segments


def epilogue_block(seqlen: int) -> int:
    """Time steps per step of the epilogue: the largest power of two up to 32 dividing S."""
    block = 1
    while block < 32 and seqlen % (block * 2) == 0:
        block *= 2
    return block


def _finish(d: Dims, sc: _Scratch, outputs: Mapping[str, torch.Tensor], qk_atomic: bool) -> None:
    """Move the fp32 accumulators into the outputs (casting where the output is 16-bit)."""
    outputs["dMIMO_O"].copy_(sc.dphi.view(d.H, d.R, d.P))
    outputs["dMIMO_Z"].copy_(sc.dzeta.view(d.H, d.R, d.P))
    outputs["dMIMO_V"].copy_(sc.dpsi.view(d.H, d.R, d.P))
    outputs["dD"].copy_(sc.dd)
    outputs["dQ_bias"].copy_(sc.dqb.view(d.H, d.R, d.N))
    outputs["dK_bias"].copy_(sc.dkb.view(d.H, d.R, d.N))
    if qk_atomic:
        assert sc.dq is not None and sc.dk is not None
        outputs["dQ"].copy_(sc.dq.view(outputs["dQ"].shape))
        outputs["dK"].copy_(sc.dk.view(outputs["dK"].shape))
