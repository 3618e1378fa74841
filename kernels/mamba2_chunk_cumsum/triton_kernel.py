"""Triton code of the Mamba2 chunk-cumsum forward template (the @triton.jit part only).

A *tile* is (batch b, a group of CHUNKS consecutive chunks, a block of BLOCK_H heads). It is processed in
Q/SUB_Q steps of SUB_Q sequence rows, the running sum of dA carried between steps; one step works on a
3-D block of CHUNKS × SUB_Q × BLOCK_H elements. Tiles are numbered so that the index named by SWEEP_HEADS
varies fastest: programs running at the same time then touch neighbouring bytes (of ``dt`` when heads
vary fastest, of the outputs when chunks do).

Two data paths (LAYOUT), both reading ``dt`` as [CHUNKS, SUB_Q, BLOCK_H] blocks (heads contiguous):

* rows (LAYOUT 1): plain loads and stores through pointer blocks. Triton's coalescing pass gives the load a
  layout of 16-byte vectors along H and the stores layouts of 16-byte vectors along the sequence; the
  arithmetic and the scan run in the load's layout and the results go through shared memory before each
  store. mamba_ssm's heads-first [BLOCK_H, Q] block compiles to the same TTGIR (layouts follow pointer
  contiguity, not the axis order of the source), so there is no separate "heads" path.
* tma (LAYOUT 2): the bulk tensor copy engine moves [CHUNKS, SUB_Q, BLOCK_H] boxes of ``dt`` into shared
  memory and [BLOCK_H, CHUNKS, SUB_Q] boxes of the outputs back out; out-of-range heads are zero-filled
  on load and dropped on store by the hardware, and in loops Triton multi-buffers the copies.

Every shape dim is a constexpr: a build is for one shape, and constant strides let the compiler prove the
alignment of 16-byte accesses and drop the head mask when BLOCK_H divides H.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _log1p(u):
    """log(1 + u) for u >= 0, accurate for small u (Goldberg: the rounding of 1 + u cancels out)."""
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


@triton.jit
def _dt_transform(x, lo, hi, SOFTPLUS: tl.constexpr):
    """softplus with the x > 20 bypass (as mamba_ssm), then the clamp to [lo, hi]."""
    if SOFTPLUS:
        # exp overflows to inf for x > 88 and log1p(inf) = inf: no NaN, and where() keeps x there.
        x = tl.where(x > 20.0, x, _log1p(tl.exp(x)))
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def _load(ptrs, mask, HINTS: tl.constexpr):
    if HINTS:  # read once: first out of L2
        return tl.load(ptrs, mask=mask, eviction_policy="evict_first")
    else:
        return tl.load(ptrs, mask=mask)


@triton.jit
def _store(ptrs, value, mask, HINTS: tl.constexpr):
    if HINTS:  # streaming store (st.global.cs): the outputs are not read back by this kernel
        tl.store(ptrs, value, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _tile_coords(t, NC: tl.constexpr, NHB: tl.constexpr, CHUNKS: tl.constexpr, SWEEP_HEADS: tl.constexpr):
    """(b, first chunk, first head) of tile number t."""
    NCG: tl.constexpr = NC // CHUNKS
    if SWEEP_HEADS:
        hb = t % NHB
        cg = (t // NHB) % NCG
        b = t // (NHB * NCG)
    else:
        cg = t % NCG
        hb = (t // NCG) % NHB
        b = t // (NHB * NCG)
    return b, cg * CHUNKS, hb


@triton.jit
def _step(x, a, bias, lo, hi, carry, AXIS: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
          CARRY: tl.constexpr):
    """One step on a block: (dt, dA cumsum along AXIS plus the carry, the new carry)."""
    if HAS_BIAS:
        x += bias
    dt = _dt_transform(x, lo, hi, SOFTPLUS)
    da = dt * a
    cs = tl.cumsum(da, axis=AXIS)
    if CARRY:
        cs += tl.expand_dims(carry, AXIS)
        carry += tl.sum(da, axis=AXIS)
    return dt, cs, carry


@triton.jit
def _tile_rows(
    t, dt_ptr, a_ptr, bias_ptr, out_ptr, da_ptr, lo, hi,
    S: tl.constexpr, H: tl.constexpr, Q: tl.constexpr, BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr,
    SUB_Q: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, SWEEP_HEADS: tl.constexpr,
    NUM_STAGES: tl.constexpr, HINTS: tl.constexpr,
):
    """rows layout: [CHUNKS, SUB_Q, BLOCK_H] pointer blocks, scan along axis 1."""
    NC: tl.constexpr = S // Q
    b, c0, hb = _tile_coords(t, NC, (H + BLOCK_H - 1) // BLOCK_H, CHUNKS, SWEEP_HEADS)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hh = h[None, None, :]
    kk = tl.arange(0, CHUNKS)[:, None, None]
    qq = tl.arange(0, SUB_Q)[None, :, None]
    # 64-bit scalar base pointers, 32-bit offsets inside the tile (cheaper than 64-bit offset tensors).
    dt_base = dt_ptr + (b.to(tl.int64) * S + c0 * Q) * H
    col0 = (b.to(tl.int64) * H * NC + c0) * Q
    out_base = out_ptr + col0
    da_base = da_ptr + col0
    in_off = (kk * Q + qq) * H + hh
    out_off = hh * (NC * Q) + kk * Q + qq
    if H % BLOCK_H == 0:
        hmask = None  # no predicate: every access can be a full 16-byte vector
        mask = None
    else:
        hmask = h < H
        mask = hh < H
    a = tl.load(a_ptr + h, mask=hmask)[None, None, :]
    bias = a
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h, mask=hmask)[None, None, :]
    carry = tl.zeros([CHUNKS, BLOCK_H], tl.float32)
    if SUB_Q == Q:
        x = _load(dt_base + in_off, mask, HINTS)
        dt, cs, carry = _step(x, a, bias, lo, hi, carry, 1, HAS_BIAS, SOFTPLUS, False)
        _store(out_base + out_off, dt.to(out_ptr.dtype.element_ty), mask, HINTS)
        _store(da_base + out_off, cs, mask, HINTS)
    else:
        for q0 in tl.range(0, Q, SUB_Q, num_stages=NUM_STAGES):
            x = _load(dt_base + q0 * H + in_off, mask, HINTS)
            dt, cs, carry = _step(x, a, bias, lo, hi, carry, 1, HAS_BIAS, SOFTPLUS, True)
            _store(out_base + q0 + out_off, dt.to(out_ptr.dtype.element_ty), mask, HINTS)
            _store(da_base + q0 + out_off, cs, mask, HINTS)


@triton.jit
def _tile_tma(
    t, dt_desc, a_ptr, bias_ptr, out_desc, da_desc, lo, hi,
    S: tl.constexpr, H: tl.constexpr, Q: tl.constexpr, BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr,
    SUB_Q: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, SWEEP_HEADS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """tma layout: descriptors over dt as (B, S/Q, Q, H) and the outputs as (B, H, S/Q, Q)."""
    b, c0, hb = _tile_coords(t, S // Q, (H + BLOCK_H - 1) // BLOCK_H, CHUNKS, SWEEP_HEADS)
    h0 = hb * BLOCK_H
    h = h0 + tl.arange(0, BLOCK_H)
    hmask = None if H % BLOCK_H == 0 else h < H
    a = tl.load(a_ptr + h, mask=hmask)[None, None, :]
    bias = a
    if HAS_BIAS:
        bias = tl.load(bias_ptr + h, mask=hmask)[None, None, :]
    carry = tl.zeros([CHUNKS, BLOCK_H], tl.float32)
    CARRY: tl.constexpr = SUB_Q != Q
    for q0 in tl.range(0, Q, SUB_Q, num_stages=NUM_STAGES):
        x = tl.reshape(dt_desc.load([b, c0, q0, h0]), [CHUNKS, SUB_Q, BLOCK_H])
        dt, cs, carry = _step(x, a, bias, lo, hi, carry, 1, HAS_BIAS, SOFTPLUS, CARRY)
        dt = tl.reshape(tl.permute(dt.to(out_desc.dtype), (2, 0, 1)), [1, BLOCK_H, CHUNKS, SUB_Q])
        out_desc.store([b, h0, c0, q0], dt)
        da_desc.store([b, h0, c0, q0], tl.reshape(tl.permute(cs, (2, 0, 1)), [1, BLOCK_H, CHUNKS, SUB_Q]))


@triton.jit
def chunk_cumsum_kernel(
    dt_ptr, a_ptr, bias_ptr, limit_ptr, out_ptr, da_ptr,
    B: tl.constexpr, S: tl.constexpr, H: tl.constexpr, Q: tl.constexpr,
    BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr, SUB_Q: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, LAYOUT: tl.constexpr, SWEEP_HEADS: tl.constexpr,
    PERSISTENT: tl.constexpr, NUM_STAGES: tl.constexpr, HINTS: tl.constexpr,
):
    """dt (B, S, H) fp32 → dt_out, dA_cumsum (B, H, S/Q, Q); limit_ptr holds [dt_min, dt_max] in fp32.

    With LAYOUT == 2 (tma), dt_ptr, out_ptr and da_ptr are tensor descriptors (see _tile_tma). PERSISTENT:
    fewer programs than tiles, each walking tiles with a grid stride (a software-pipelined loop when it
    is the innermost one); otherwise one program per tile. HINTS (rows only): evict-first loads and
    streaming stores.
    """
    num_tiles: tl.constexpr = B * (S // Q // CHUNKS) * ((H + BLOCK_H - 1) // BLOCK_H)
    lo = tl.load(limit_ptr)
    hi = tl.load(limit_ptr + 1)
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
            if LAYOUT == 2:
                _tile_tma(t, dt_ptr, a_ptr, bias_ptr, out_ptr, da_ptr, lo, hi, S, H, Q, BLOCK_H, CHUNKS,
                          SUB_Q, HAS_BIAS, SOFTPLUS, SWEEP_HEADS, NUM_STAGES)
            else:
                _tile_rows(t, dt_ptr, a_ptr, bias_ptr, out_ptr, da_ptr, lo, hi, S, H, Q, BLOCK_H, CHUNKS,
                           SUB_Q, HAS_BIAS, SOFTPLUS, SWEEP_HEADS, NUM_STAGES, HINTS)
    else:
        if LAYOUT == 2:
            _tile_tma(tl.program_id(0), dt_ptr, a_ptr, bias_ptr, out_ptr, da_ptr, lo, hi, S, H, Q, BLOCK_H,
                      CHUNKS, SUB_Q, HAS_BIAS, SOFTPLUS, SWEEP_HEADS, NUM_STAGES)
        else:
            _tile_rows(tl.program_id(0), dt_ptr, a_ptr, bias_ptr, out_ptr, da_ptr, lo, hi, S, H, Q, BLOCK_H,
                       CHUNKS, SUB_Q, HAS_BIAS, SOFTPLUS, SWEEP_HEADS, NUM_STAGES, HINTS)


def num_tiles(B: int, S: int, H: int, Q: int, block_h: int, chunks: int) -> int:
    """Number of tiles (and of programs when not persistent)."""
    return B * (S // Q // chunks) * triton.cdiv(H, block_h)
