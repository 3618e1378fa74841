"""Triton kernels of the Mamba3 MIMO backward (math in :mod:`tuner.kernels.mamba3_mimo.reference`).

One chunk of ``C`` time steps of one (batch, head) is worked on as ``C*R`` rows (row ``i`` is time ``i // R``,
rank ``i % R``). :func:`_chunk_bwd` holds every per-chunk gradient formula; it needs the state before the
chunk (N×P) and the gradient of the state after it. Chunks are taken in groups of GC consecutive chunks:

* :func:`group_local_kernel` computes every group's own state increments in parallel (pass A);
* :func:`state_scan_kernel` runs the two linear recurrences over groups (multiply-adds only); for one-chunk
  groups :func:`state_walk_kernel` can do pass A and the scan at once (``state_pass`` walk), each program
  walking the chunks with a tile of the state in registers;
* :func:`group_bwd_kernel` gives each group one program (pass C): it walks its chunks forward writing the
  states, then backward carrying the state gradient, calling :func:`_chunk_bwd` for each.

GC = 1 is the split variant (every chunk in parallel, no walk); GC = S / C the fused one (one program per
(batch, head) walking every chunk, like mamba_ssm's TileLang kernels; no pass A, no scan). The split2
variant runs pass C as two kernels, :func:`chunk_values_kernel` then :func:`chunk_qk_kernel`, each with
half of :func:`_chunk_bwd` (fewer live tiles per program, at the cost of a global round trip of the
scores and dy).

:func:`epilogue_kernel` then turns per-step scratch (angle, factor and gamma gradients) into dAngles, dDT and
dTrap (the angle gradient needs a reverse running sum over the whole sequence).

Tensors are contiguous: Q, K (B,S,R,G,N); V, Z, dOut (B,S,H,P); ADT, DT, Trap (B,H,S); biases (H,R,N);
MIMO_* (H,R,P); angles (B,S,H,A) with A = N / rotary divisor; states (B,H,NC,N,P) fp32.
``PREC`` picks the matmul operand precision (0 the input dtype bf16/fp16, 1 tf32, 2 tf32x3, 3 a hi+lo split in
the input dtype); ``PREC_ROT`` the precision of the matmuls that feed the rotated q/k gradients and the
states, whose rounding the angle gradient amplifies (it is a small difference of q-side and k-side terms).
``INTERP`` (the Triton interpreter) emulates the GPU's rounding, which the interpreter gets wrong for bf16.
"""

from __future__ import annotations

import triton
import triton.language as tl


# -- precision helpers -------------------------------------------------------------------------------------
@triton.jit
def _rne_bf16(x):
    """Round fp32 to the nearest bf16 value (ties to even), kept in fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _rne_tf32(x):
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0xFFF + ((bits >> 13) & 1)
    return ((bits >> 13) << 13).to(tl.float32, bitcast=True)


@triton.jit
def _round(x, PREC: tl.constexpr, LOWP: tl.constexpr):
    """Interpreter only: x rounded as a PREC matmul operand on the GPU (fp32 kept for tf32x3)."""
    if PREC == 1:
        return _rne_tf32(x)
    if PREC == 2:
        return x
    if tl.bfloat16 == LOWP:
        return _rne_bf16(x)
    return x.to(LOWP).to(tl.float32)


@triton.jit
def _dot(a, b, acc, TF32: tl.constexpr):
    """acc + a @ b (TF32: 0 the operands' own precision, 1 tf32, 2 tf32x3).

    The launcher compiles these kernels with Hopper's wgmma disabled (mma.sync only): its lowering of these
    register-operand dots inside loops faulted with illegal memory accesses on the H200.
    """
    if TF32 == 1:
        return tl.dot(a, b, acc, input_precision="tf32")
    elif TF32 == 2:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """acc + a @ b in fp32; operand precision PREC: 0 LOWP, 1 tf32, 2 tf32x3, 3 LOWP hi+lo.

    PREC 3 writes each operand as hi + lo in LOWP and sums hi·hi + hi·lo + lo·hi: about 16 mantissa bits
    with 16-bit tensor-core instructions only (for hardware without tf32). Under the interpreter the
    operands are rounded as the GPU would round them and multiplied in fp32.
    """
    if PREC == 3:
        a_hi = _mm_operand(a, LOWP, INTERP)
        b_hi = _mm_operand(b, LOWP, INTERP)
        a_lo = _mm_operand(a - a_hi.to(tl.float32), LOWP, INTERP)
        b_lo = _mm_operand(b - b_hi.to(tl.float32), LOWP, INTERP)
        acc = _dot(a_hi, b_lo, acc, 0)
        acc = _dot(a_lo, b_hi, acc, 0)
        return _dot(a_hi, b_hi, acc, 0)
    if INTERP:
        return _dot(_round(a, PREC, LOWP), _round(b, PREC, LOWP), acc, 0)
    if PREC == 0:
        return _dot(a.to(LOWP), b.to(LOWP), acc, 0)
    return _dot(a, b, acc, PREC)


@triton.jit
def _mm(a, b, PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """a @ b in fp32 (see _mma)."""
    acc = tl.zeros((a.shape[0], b.shape[1]), dtype=tl.float32)
    return _mma(a, b, acc, PREC, LOWP, INTERP)


@triton.jit
def _mm_operand(x, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """x as a LOWP matmul operand (kept fp32 but rounded under the interpreter, whose 16-bit dot is wrong)."""
    if INTERP:
        return _round(x, 0, LOWP)
    return x.to(LOWP)


@triton.jit
def _out(x, ptr, INTERP: tl.constexpr):
    """x ready to store at ptr: the interpreter truncates fp32 -> bf16, so round first there."""
    if INTERP and ptr.dtype.element_ty == tl.bfloat16:
        x = _rne_bf16(x)
    return x


# -- shape helpers -----------------------------------------------------------------------------------------
@triton.jit
def _fold_rank(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(C*R, X) -> (C, X): sum over the rank of each time step."""
    return tl.sum(tl.reshape(x, (C, R, X)), axis=1)


@triton.jit
def _fold_time(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(C*R, X) -> (R, X): sum over the time steps of the chunk."""
    return tl.sum(tl.reshape(x, (C, R, X)), axis=0)


@triton.jit
def _over_rank(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(C, X) per-step values -> (C*R, X) chunk rows (row t*R + r holds step t)."""
    return tl.reshape(tl.broadcast_to(x[:, None, :], (C, R, X)), (C * R, X))


@triton.jit
def _time_rows(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(R, X) per-rank values -> (C*R, X) chunk rows (row t*R + r holds rank r)."""
    return tl.reshape(tl.broadcast_to(x[None, :, :], (C, R, X)), (C * R, X))


@triton.jit
def _silu_parts(x):
    """silu(x) and its derivative; the sigmoid divides with the fast (non-IEEE) division, whose precise
    form costs many registers per element on large tiles."""
    sg = tl.math.fdiv(1.0, 1.0 + tl.exp(-x))
    return x * sg, sg * (1.0 + x * (1.0 - sg))


# -- per-chunk loads ---------------------------------------------------------------------------------------
@triton.jit
def _scalars(ADT, DT, TRAP, b, h, t0,
             S: tl.constexpr, H: tl.constexpr, C: tl.constexpr, R: tl.constexpr):
    """Per-row decay, trapezoid factor and gamma of the chunk starting at t0."""
    rows = tl.arange(0, C * R)
    ti = rows // R
    u = tl.arange(0, C)
    base = (b * H + h) * S + t0
    adt = tl.load(ADT + base + u).to(tl.float32)
    cs = tl.sum(tl.where(u[None, :] <= ti[:, None], adt[None, :], 0.0), axis=1)  # (CR,) local cumsum
    cs_last = tl.sum(adt, axis=0)
    dt = tl.load(DT + base + ti).to(tl.float32)
    sig = tl.sigmoid(tl.load(TRAP + base + ti).to(tl.float32))
    nxt = t0 + ti + 1 < S
    dt_n = tl.load(DT + base + ti + 1, mask=nxt, other=0.0).to(tl.float32)
    sig_n = tl.sigmoid(tl.load(TRAP + base + ti + 1, mask=nxt, other=0.0).to(tl.float32))
    gamma = dt * sig
    factor = gamma + dt_n * (1.0 - sig_n)
    return cs, cs_last, gamma, factor


@triton.jit
def _rows_p(X, b, h, t0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
            C: tl.constexpr):
    """A (B,S,H,P) tensor's chunk repeated over rank rows: (C*R, P) fp32.

    Loaded once per step and broadcast over the rank (R x fewer addresses than loading every row)."""
    return _rows_cols(X, b, h, t0, 0, S, H, P, P, R, C)


@triton.jit
def _rows_cols(X, b, h, t0, p0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr, PB: tl.constexpr,
               R: tl.constexpr, C: tl.constexpr):
    """Columns [p0, p0 + PB) of :func:`_rows_p`: (C*R, PB) fp32."""
    u = tl.arange(0, C)
    p = p0 + tl.arange(0, PB)
    x = tl.load(X + ((b * S + t0 + u) * H + h)[:, None] * P + p[None, :]).to(tl.float32)
    return _over_rank(x, C, R, PB)


@triton.jit
def _param_rows(W, h, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """A (H,R,P) parameter's rows for head h, one per chunk row: (C*R, P)."""
    return _param_cols(W, h, 0, P, P, R, C)


@triton.jit
def _param_cols(W, h, p0, P: tl.constexpr, PB: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """Columns [p0, p0 + PB) of :func:`_param_rows`: (C*R, PB)."""
    r = tl.arange(0, R)
    p = p0 + tl.arange(0, PB)
    return _time_rows(tl.load(W + (h * R + r)[:, None] * P + p[None, :]), C, R, PB)


@triton.jit
def _dy(DOUT, Z, MO, MZ, b, h, t0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr,
        R: tl.constexpr, C: tl.constexpr):
    """Gradient reaching y (before the SiLU gate): dOut ⊙ MIMO_O ⊙ silu(Z ⊙ MIMO_Z), per chunk row."""
    return _dy_cols(DOUT, Z, MO, MZ, b, h, t0, 0, S, H, P, P, R, C)


@triton.jit
def _dy_cols(DOUT, Z, MO, MZ, b, h, t0, p0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr,
             PB: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """Columns [p0, p0 + PB) of :func:`_dy`: (C*R, PB)."""
    silu, _dsilu = _silu_parts(_rows_cols(Z, b, h, t0, p0, S, H, P, PB, R, C) * _param_cols(MZ, h, p0, P, PB, R, C))
    return _rows_cols(DOUT, b, h, t0, p0, S, H, P, PB, R, C) * _param_cols(MO, h, p0, P, PB, R, C) * silu


# -- blocked q/k and state loads ----------------------------------------------------------------------------
@triton.jit
def rotary_table_kernel(ANG, COS, SIN, n, BLOCK: tl.constexpr):
    """cos and sin of every rotary angle, computed once (the chunk kernels read them for each rank row)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    th = tl.load(ANG + i, mask=i < n, other=0.0)
    tl.store(COS + i, tl.cos(th), mask=i < n)
    tl.store(SIN + i, tl.sin(th), mask=i < n)


@triton.jit
def _cs_block(COS, SIN, b, h, t0, jb, S: tl.constexpr, H: tl.constexpr, R: tl.constexpr, A: tl.constexpr,
              C: tl.constexpr, NB: tl.constexpr):
    """cos/sin (C*R, NB) of pair columns j = jb*NB + [0, NB); columns j >= A do not rotate (cos 1, sin 0)."""
    u = tl.arange(0, C)
    j = jb * NB + tl.arange(0, NB)
    off = ((b * S + t0 + u) * H + h)[:, None] * A + j[None, :]
    m = (j < A)[None, :] & (u < C)[:, None]
    cos = tl.load(COS + off, mask=m, other=1.0)
    sin = tl.load(SIN + off, mask=m, other=0.0)
    return _over_rank(cos, C, R, NB), _over_rank(sin, C, R, NB)


@triton.jit
def _rot_block(X, XB, cos, sin, b, h, g, t0, jb, S: tl.constexpr, G: tl.constexpr, N: tl.constexpr,
               R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr):
    """Biased, rotated q or k columns j (lo) and N/2 + j (hi) for the pair block jb: two (C*R, NB) tiles.

    Pairs (j, N/2+j) turn by the angle of j. Columns past N/2 (blocks wider than N/2) load as 0.
    """
    rows = tl.arange(0, C * R)
    j = jb * NB + tl.arange(0, NB)
    jm = (j < N // 2)[None, :]
    off = (((b * S + t0 + rows // R) * R + rows % R) * G + g)[:, None] * N + j[None, :]
    r = tl.arange(0, R)
    boff = (h * R + r)[:, None] * N + j[None, :]
    bm = jm & (r < R)[:, None]
    lo = tl.load(X + off, mask=jm, other=0.0).to(tl.float32)
    lo += _time_rows(tl.load(XB + boff, mask=bm, other=0.0), C, R, NB)
    hi = tl.load(X + off + N // 2, mask=jm, other=0.0).to(tl.float32)
    hi += _time_rows(tl.load(XB + boff + N // 2, mask=bm, other=0.0), C, R, NB)
    return cos * lo - sin * hi, sin * lo + cos * hi


@triton.jit
def _state_rows(PTR, lim, jb, N: tl.constexpr, P: tl.constexpr, NB: tl.constexpr):
    """Rows j and N/2 + j of an N×P fp32 state at PTR, (NB, P) each, for j < lim (N/2, or 0: all zeros)."""
    j = jb * NB + tl.arange(0, NB)
    p = tl.arange(0, P)
    off = j[:, None] * P + p[None, :]
    m = (j < lim)[:, None] & (p < P)[None, :]
    return tl.load(PTR + off, mask=m, other=0.0), tl.load(PTR + off + (N // 2) * P, mask=m, other=0.0)


@triton.jit
def _store_rows(PTR, lo, hi, jb, N: tl.constexpr, P: tl.constexpr, NB: tl.constexpr):
    j = jb * NB + tl.arange(0, NB)
    off = j[:, None] * P + tl.arange(0, P)[None, :]
    m = (j < N // 2)[:, None]
    tl.store(PTR + off, lo, mask=m)
    tl.store(PTR + off + (N // 2) * P, hi, mask=m)


@triton.jit
def _put_qk(OUT, BIAS, lo, hi, b, h, g, t0, jb, S: tl.constexpr, G: tl.constexpr, N: tl.constexpr,
            R: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, ATOMIC: tl.constexpr, INTERP: tl.constexpr):
    """Write (or add, where several heads share a q/k group) a block of dq/dk into (B,S,R,G,N), and add
    its sum over the chunk's steps into the head's fp32 bias gradient (H,R,N)."""
    rows = tl.arange(0, C * R)
    j = jb * NB + tl.arange(0, NB)
    jm = (j < N // 2)[None, :]
    off = (((b * S + t0 + rows // R) * R + rows % R) * G + g)[:, None] * N + j[None, :]
    if ATOMIC:
        tl.atomic_add(OUT + off, lo, mask=jm, sem="relaxed")
        tl.atomic_add(OUT + off + N // 2, hi, mask=jm, sem="relaxed")
    else:
        tl.store(OUT + off, _out(lo, OUT, INTERP), mask=jm)
        tl.store(OUT + off + N // 2, _out(hi, OUT, INTERP), mask=jm)
    boff = (h * R + tl.arange(0, R))[:, None] * N + j[None, :]
    tl.atomic_add(BIAS + boff, _fold_time(lo, C, R, NB), mask=jm, sem="relaxed")
    tl.atomic_add(BIAS + boff + N // 2, _fold_time(hi, C, R, NB), mask=jm, sem="relaxed")


# -- the per-chunk backward --------------------------------------------------------------------------------
@triton.jit
def _coef(cs, gamma, factor, ti):
    """Score weights of row pairs: decay·factor of the key step (earlier steps), gamma on the same step."""
    lt = ti[:, None] > ti[None, :]
    dm = tl.exp(tl.where(lt, cs[:, None] - cs[None, :], -float("inf")))
    return dm, dm * factor[None, :] + tl.where(ti[:, None] == ti[None, :], gamma[:, None], 0.0)


@triton.jit
def _gate_bwd(y, vt, DOUT, Z, MO, MZ, DZ, b, h, t0, S: tl.constexpr, H: tl.constexpr,
              P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, INTERP: tl.constexpr):
    """Through the SiLU gate and MIMO_O: dy and the partials of dMIMO_O, dMIMO_Z, dD; stores dZ.

    Two passes over the gate, each reading what it needs, so that few C*R x P tiles are live at once."""
    dout = _rows_p(DOUT, b, h, t0, S, H, P, R, C)
    zz = _rows_p(Z, b, h, t0, S, H, P, R, C) * _param_rows(MZ, h, P, R, C)
    silu, _dsilu = _silu_parts(zz)
    dphi = _fold_time(dout * y * silu, C, R, P)
    dy = dout * _param_rows(MO, h, P, R, C) * silu
    tl.debug_barrier()  # keeps the second pass's loads from being hoisted into the first
    zeta = _param_rows(MZ, h, P, R, C)
    z = _rows_p(Z, b, h, t0, S, H, P, R, C)
    _silu, dsilu = _silu_parts(z * zeta)
    dzt = _rows_p(DOUT, b, h, t0, S, H, P, R, C) * _param_rows(MO, h, P, R, C) * y * dsilu
    u = tl.arange(0, C)
    vp = ((b * S + t0 + u) * H + h)[:, None] * P + tl.arange(0, P)[None, :]
    tl.store(DZ + vp, _out(_fold_rank(dzt * zeta, C, R, P), DZ, INTERP))
    dzeta = _fold_time(dzt * z, C, R, P)
    return dy, dphi, dzeta, tl.sum(tl.sum(dy * vt, axis=1), axis=0)


@triton.jit
def _v_bwd(dvt, V, MV, DV, b, h, t0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
           C: tl.constexpr, INTERP: tl.constexpr):
    """Through ṽ = V ⊙ MIMO_V: stores dV, returns the dMIMO_V partial (V, MIMO_V reloaded, not kept live)."""
    u = tl.arange(0, C)
    vp = ((b * S + t0 + u) * H + h)[:, None] * P + tl.arange(0, P)[None, :]
    tl.store(DV + vp, _out(_fold_rank(dvt * _param_rows(MV, h, P, R, C), C, R, P), DV, INTERP))
    return _fold_time(dvt * _rows_p(V, b, h, t0, S, H, P, R, C), C, R, P)


@triton.jit
def _scores_and_reads(Q, K, QB, KB, COS, SIN, HP, hp_lim, DH, dh_lim, b, h, g, t0,
                      S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                      R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                      PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr, WITH_KDH: tl.constexpr):
    """Pass 1 over pair blocks: scores q·k, q·Hp, k·dH (C*R rows; zeros unless WITH_KDH) and Σ Hp⊙dH."""
    CR: tl.constexpr = C * R
    a = tl.zeros((CR, CR), dtype=tl.float32)
    qh = tl.zeros((CR, P), dtype=tl.float32)
    kdh = tl.zeros((CR, P), dtype=tl.float32)
    hdh = tl.zeros((NB, P), dtype=tl.float32)
    for jb in range((N // 2 + NB - 1) // NB):
        cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
        qlo, qhi = _rot_block(Q, QB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        klo, khi = _rot_block(K, KB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        a = _mma(qhi, tl.trans(khi), _mma(qlo, tl.trans(klo), a, PREC, LOWP, INTERP), PREC, LOWP, INTERP)
        hp_lo, hp_hi = _state_rows(HP, hp_lim, jb, N, P, NB)
        qh = _mma(qhi, hp_hi, _mma(qlo, hp_lo, qh, PREC, LOWP, INTERP), PREC, LOWP, INTERP)
        dh_lo, dh_hi = _state_rows(DH, dh_lim, jb, N, P, NB)
        if WITH_KDH:
            kdh = _mma(khi, dh_hi, _mma(klo, dh_lo, kdh, PREC, LOWP, INTERP), PREC, LOWP, INTERP)
        hdh += hp_lo * dh_lo + hp_hi * dh_hi
    return a, qh, kdh, tl.sum(tl.sum(hdh, axis=1), axis=0)


@triton.jit
def _k_dh(K, KB, COS, SIN, DH, dh_lim, b, h, g, t0,
          S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
          R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
          PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """k·dH (C*R x P) in a walk of its own over the pair blocks (see :func:`_chunk_values`' LEAN)."""
    kdh = tl.zeros((C * R, P), dtype=tl.float32)
    for jb in range((N // 2 + NB - 1) // NB):
        cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
        klo, khi = _rot_block(K, KB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        dh_lo, dh_hi = _state_rows(DH, dh_lim, jb, N, P, NB)
        kdh = _mma(khi, dh_hi, _mma(klo, dh_lo, kdh, PREC, LOWP, INTERP), PREC, LOWP, INTERP)
    return kdh


@triton.jit
def _chunk_bwd(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN,
               DV, DZ, DADT, DTH, DFAC, DGAM, DQ, DK, DQB, DKB,
               HP, hp_lim, DH, dh_lim, DH_OUT, b, h, c,
               S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
               R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
               ATOMIC: tl.constexpr, WRITE_DH: tl.constexpr,
               PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Every gradient of chunk c of (b, h), given the state before it and the state gradient after it.

    HP and DH point at N×P fp32 row-major tiles: the state before the chunk and the gradient of the state
    after it (rows of pairs j >= ``hp_lim`` / ``dh_lim`` read as 0: pass N/2, or 0 for a zero tile).
    With WRITE_DH the gradient of the state before the chunk goes to DH_OUT. Stores dV, dZ, dADT
    (chunk-local reverse sum of the decay gradient), dq/dk (stored, or added when ATOMIC) with their bias
    gradients, and the per-step scratch (angle, factor, gamma gradients).
    Returns the chunk's partials of dMIMO_O, dMIMO_Z, dMIMO_V, dD and its total log-decay.

    Two halves, :func:`_chunk_values` then :func:`_chunk_qk`; the split2 variant runs them as two kernels
    with the scores, dy and Σ Hp⊙dH passed through global memory, so that each holds fewer live tiles.
    """
    a, hdh, dy, dphi, dzeta, dpsi, d_d = _chunk_values(
        Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, DV, DZ, HP, hp_lim, DH, dh_lim,
        DV, b, h, c, S, H, G, N, P, R, A, C, NB, PREC, LOWP, INTERP, False)
    cs_last = _chunk_qk(a, hdh, dy, Q, K, V, ADT, DT, TRAP, QB, KB, MV, COS, SIN, DADT, DTH, DFAC, DGAM,
                        DQ, DK, DQB, DKB, HP, hp_lim, DH, dh_lim, DH_OUT, b, h, c,
                        S, H, G, N, P, R, A, C, NB, ATOMIC, WRITE_DH, PREC_ROT, LOWP, INTERP, False)
    return dphi, dzeta, dpsi, d_d, cs_last


@triton.jit
def _chunk_values(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, DV, DZ,
                  HP, hp_lim, DH, dh_lim, SA_OUT, b, h, c,
                  S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                  R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                  PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr, LEAN: tl.constexpr):
    """First half of :func:`_chunk_bwd`: scores, the recomputed output and everything on the value side.

    Stores dZ and dV; returns the scores q·k (C*R x C*R), Σ Hp⊙dH, the gradient reaching y (C*R x P) and
    the chunk's partials of dMIMO_O, dMIMO_Z, dMIMO_V, dD. LEAN (split2's value kernel) holds fewer tiles:
    it stores the scores, row-major, at SA_OUT as soon as they are complete (the caller needs them only
    there), and computes k·dH in a walk of its own after the gate instead of holding it from the first.
    The N axis is walked in blocks of NB rotary pairs so that only C*R x NB tiles of q and k are live.
    """
    t0 = c * C
    g = h // (H // G)
    ti = tl.arange(0, C * R) // R
    d_h = tl.load(D + h)
    cs, cs_last, gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
    e = tl.exp(cs)
    wf = tl.exp(cs_last - cs) * factor
    a, qh, kdh, hdh = _scores_and_reads(Q, K, QB, KB, COS, SIN, HP, hp_lim, DH, dh_lim, b, h, g, t0,
                                        S, H, G, N, P, R, A, C, NB, PREC, LOWP, INTERP, not LEAN)
    if LEAN:
        rows = tl.arange(0, C * R)
        tl.store(SA_OUT + rows[:, None] * (C * R) + rows[None, :], a)
    vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)

    # Recompute y (the gate and MIMO_O gradients need it), then the gradient reaching y.
    _dm, coef = _coef(cs, gamma, factor, ti)
    lf = a * coef
    y = _mma(lf, vt, e[:, None] * qh + d_h * vt, PREC, LOWP, INTERP)
    dy, dphi, dzeta, d_d = _gate_bwd(y, vt, DOUT, Z, MO, MZ, DZ, b, h, t0, S, H, P, R, C, INTERP)

    # Values: intra-chunk, state and D paths.
    if LEAN:
        kdh = _k_dh(K, KB, COS, SIN, DH, dh_lim, b, h, g, t0, S, H, G, N, P, R, A, C, NB, PREC, LOWP, INTERP)
    dvt = _mma(tl.trans(lf), dy, d_h * dy + wf[:, None] * kdh, PREC, LOWP, INTERP)
    dpsi = _v_bwd(dvt, V, MV, DV, b, h, t0, S, H, P, R, C, INTERP)
    return a, hdh, dy, dphi, dzeta, dpsi, d_d


@triton.jit
def _dq_block(da, dy, e, Q, K, QB, KB, COS, SIN, HP, hp_lim, b, h, g, t0, jb,
              S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
              R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
              PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Pair block jb: its cos/sin, rotated q and k, the rotated-q gradient (before the inverse rotation)
    and the block's share of the decay-gradient rows (the state path's q·Hp term)."""
    cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
    qlo, qhi = _rot_block(Q, QB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
    klo, khi = _rot_block(K, KB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
    hp_lo, hp_hi = _state_rows(HP, hp_lim, jb, N, P, NB)
    dq_lo = e[:, None] * _mm(dy, tl.trans(hp_lo), PREC_ROT, LOWP, INTERP)
    dq_hi = e[:, None] * _mm(dy, tl.trans(hp_hi), PREC_ROT, LOWP, INTERP)
    g_add = tl.sum(dq_lo * qlo + dq_hi * qhi, axis=1)
    dq_lo = _mma(da, klo, dq_lo, PREC_ROT, LOWP, INTERP)
    dq_hi = _mma(da, khi, dq_hi, PREC_ROT, LOWP, INTERP)
    return cos, sin, qlo, qhi, klo, khi, dq_lo, dq_hi, g_add


@triton.jit
def _dk_block(da, vt, wf, qlo, qhi, klo, khi, DH, dh_lim, jb, N: tl.constexpr, P: tl.constexpr,
              NB: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Pair block jb: the state-gradient rows it reads, the rotated-k gradient (before the inverse
    rotation) and the block's share of the k·(ṽ dH) rows."""
    dh_lo, dh_hi = _state_rows(DH, dh_lim, jb, N, P, NB)
    vdh_lo = _mm(vt, tl.trans(dh_lo), PREC_ROT, LOWP, INTERP)
    vdh_hi = _mm(vt, tl.trans(dh_hi), PREC_ROT, LOWP, INTERP)
    kvd_add = tl.sum(klo * vdh_lo + khi * vdh_hi, axis=1)
    dk_lo = _mma(tl.trans(da), qlo, wf[:, None] * vdh_lo, PREC_ROT, LOWP, INTERP)
    dk_hi = _mma(tl.trans(da), qhi, wf[:, None] * vdh_hi, PREC_ROT, LOWP, INTERP)
    return dh_lo, dh_hi, dk_lo, dk_hi, kvd_add


@triton.jit
def _qk_two_walks(da, dy, V, MV, e, wf, cs_last, g_row, kvd, Q, K, QB, KB, COS, SIN, DTH, DQ, DK, DQB, DKB,
                  HP, hp_lim, DH, dh_lim, DH_OUT, b, h, g, t0,
                  S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                  R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                  ATOMIC: tl.constexpr, WRITE_DH: tl.constexpr,
                  PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Pass 2 of :func:`_chunk_qk` as two walks over the pair blocks: the q side (dq, the state gradient
    before the chunk) needs dy but not ṽ, the k side (dk) ṽ but not dy, so each walk holds one C*R x P tile
    fewer. The angle gradient gets its q-side part in the first walk and its k-side part added in the
    second (re-read after a barrier: other threads stored it). Returns the updated g_row and kvd."""
    u = tl.arange(0, C)
    for jb in range((N // 2 + NB - 1) // NB):
        cos, sin, qlo, qhi, klo, khi, dq_lo, dq_hi, g_add = _dq_block(
            da, dy, e, Q, K, QB, KB, COS, SIN, HP, hp_lim, b, h, g, t0, jb, S, H, G, N, P, R, A, C, NB,
            PREC_ROT, LOWP, INTERP)
        g_row += g_add
        if WRITE_DH:
            dh_lo, dh_hi = _state_rows(DH, dh_lim, jb, N, P, NB)
            eq = e[:, None] * dy
            eL = tl.exp(cs_last)
            _store_rows(DH_OUT, _mma(tl.trans(qlo), eq, eL * dh_lo, PREC_ROT, LOWP, INTERP),
                        _mma(tl.trans(qhi), eq, eL * dh_hi, PREC_ROT, LOWP, INTERP), jb, N, P, NB)
        j = jb * NB + tl.arange(0, NB)
        tl.store(DTH + ((b * S + t0 + u) * H + h)[:, None] * A + j[None, :],
                 _fold_rank(dq_hi * qlo - dq_lo * qhi, C, R, NB), mask=(j < A)[None, :])
        _put_qk(DQ, DQB, cos * dq_lo + sin * dq_hi, cos * dq_hi - sin * dq_lo, b, h, g, t0, jb,
                S, G, N, R, C, NB, ATOMIC, INTERP)
    tl.debug_barrier()  # the angle-gradient rows stored above are re-read by other threads
    vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)  # reloaded: not held through walk 1
    for jb in range((N // 2 + NB - 1) // NB):
        cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
        qlo, qhi = _rot_block(Q, QB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        klo, khi = _rot_block(K, KB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        _dh_lo, _dh_hi, dk_lo, dk_hi, kvd_add = _dk_block(da, vt, wf, qlo, qhi, klo, khi, DH, dh_lim, jb, N, P,
                                                          NB, PREC_ROT, LOWP, INTERP)
        kvd += kvd_add
        j = jb * NB + tl.arange(0, NB)
        ptrs = DTH + ((b * S + t0 + u) * H + h)[:, None] * A + j[None, :]
        jm = (j < A)[None, :]
        tl.store(ptrs, tl.load(ptrs, mask=jm, other=0.0) + _fold_rank(dk_hi * klo - dk_lo * khi, C, R, NB),
                 mask=jm)
        _put_qk(DK, DKB, cos * dk_lo + sin * dk_hi, cos * dk_hi - sin * dk_lo, b, h, g, t0, jb,
                S, G, N, R, C, NB, ATOMIC, INTERP)
    return g_row, kvd


@triton.jit
def _chunk_qk(a, hdh, dy, Q, K, V, ADT, DT, TRAP, QB, KB, MV, COS, SIN, DADT, DTH, DFAC, DGAM,
              DQ, DK, DQB, DKB, HP, hp_lim, DH, dh_lim, DH_OUT, b, h, c,
              S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
              R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
              ATOMIC: tl.constexpr, WRITE_DH: tl.constexpr,
              PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr, TWO_WALKS: tl.constexpr):
    """Second half of :func:`_chunk_bwd`, from the scores ``a``, Σ Hp⊙dH ``hdh`` and ``dy`` of the first:
    the score gradient, rotated q/k gradients and their inverse rotation, angle gradients, the state
    gradient before the chunk (WRITE_DH) and the per-step outputs. Returns the chunk's total log-decay.

    TWO_WALKS walks the pair blocks twice (:func:`_qk_two_walks`, ṽ reloaded for the second): on sm_90
    that cuts the split2 q/k kernel's spills 7x (280 -> 40 B at N128 P64 R4, 32 rows, 8 warps) but adds to
    the one-kernel variants' (2512 -> 2808 B), whose first half keeps more tiles live; ptxas 13.4 via
    benchmarks/sm90_resources.py."""
    CR: tl.constexpr = C * R
    t0 = c * C
    g = h // (H // G)
    ti = tl.arange(0, CR) // R
    u = tl.arange(0, C)
    cs, cs_last, gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
    e = tl.exp(cs)
    w = tl.exp(cs_last - cs)
    wf = w * factor
    vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)

    # Score gradient; factor, gamma and decay gradients of the intra-chunk scores.
    dlf = _mm(dy, tl.trans(vt), PREC_ROT, LOWP, INTERP)
    dm, coef = _coef(cs, gamma, factor, ti)
    pm = dlf * a
    x = pm * dm * factor[None, :]
    g_row = tl.sum(x, axis=1) - tl.sum(x, axis=0)
    dfac_row = tl.sum(pm * dm, axis=0)
    dgam_row = tl.sum(tl.where(ti[:, None] == ti[None, :], pm, 0.0), axis=1)
    da = dlf * coef

    # Pass 2 over pair blocks: rotated q/k gradients, their inverse rotation, angle gradients.
    kvd = tl.zeros((CR,), dtype=tl.float32)
    if TWO_WALKS:
        g_row, kvd = _qk_two_walks(da, dy, V, MV, e, wf, cs_last, g_row, kvd, Q, K, QB, KB, COS, SIN, DTH, DQ, DK,
                                   DQB, DKB, HP, hp_lim, DH, dh_lim, DH_OUT, b, h, g, t0, S, H, G, N, P, R, A,
                                   C, NB, ATOMIC, WRITE_DH, PREC_ROT, LOWP, INTERP)
    else:
        for jb in range((N // 2 + NB - 1) // NB):
            cos, sin, qlo, qhi, klo, khi, dq_lo, dq_hi, g_add = _dq_block(
                da, dy, e, Q, K, QB, KB, COS, SIN, HP, hp_lim, b, h, g, t0, jb, S, H, G, N, P, R, A, C, NB,
                PREC_ROT, LOWP, INTERP)
            g_row += g_add
            dh_lo, dh_hi, dk_lo, dk_hi, kvd_add = _dk_block(da, vt, wf, qlo, qhi, klo, khi, DH, dh_lim, jb, N, P,
                                                            NB, PREC_ROT, LOWP, INTERP)
            kvd += kvd_add
            if WRITE_DH:
                eq = e[:, None] * dy
                eL = tl.exp(cs_last)
                _store_rows(DH_OUT, _mma(tl.trans(qlo), eq, eL * dh_lo, PREC_ROT, LOWP, INTERP),
                            _mma(tl.trans(qhi), eq, eL * dh_hi, PREC_ROT, LOWP, INTERP), jb, N, P, NB)
            dth = _fold_rank(dq_hi * qlo - dq_lo * qhi + dk_hi * klo - dk_lo * khi, C, R, NB)
            j = jb * NB + tl.arange(0, NB)
            tl.store(DTH + ((b * S + t0 + u) * H + h)[:, None] * A + j[None, :], dth, mask=(j < A)[None, :])
            _put_qk(DQ, DQB, cos * dq_lo + sin * dq_hi, cos * dq_hi - sin * dq_lo, b, h, g, t0, jb,
                    S, G, N, R, C, NB, ATOMIC, INTERP)
            _put_qk(DK, DKB, cos * dk_lo + sin * dk_hi, cos * dk_hi - sin * dk_lo, b, h, g, t0, jb,
                    S, G, N, R, C, NB, ATOMIC, INTERP)

    # Per-step outputs: dADT (reverse sum of the decay gradient within the chunk), factor and gamma.
    xs = wf * kvd
    g_t = tl.sum(tl.reshape(g_row - xs, (C, R)), axis=1)
    g_t += tl.where(u == C - 1, tl.exp(cs_last) * hdh + tl.sum(xs, axis=0), 0.0)
    sp = (b * H + h) * S + t0 + u
    tl.store(DADT + sp, tl.sum(tl.where(u[None, :] >= u[:, None], g_t[None, :], 0.0), axis=1))
    tl.store(DFAC + sp, tl.sum(tl.reshape(dfac_row + w * kvd, (C, R)), axis=1))
    tl.store(DGAM + sp, tl.sum(tl.reshape(dgam_row, (C, R)), axis=1))
    return cs_last


@triton.jit
def _add_params(DPHI, DZETA, DPSI, DDD, h, dphi, dzeta, dpsi, d_d, P: tl.constexpr, R: tl.constexpr):
    """Add one program's partial sums of the per-head MIMO and D gradients (fp32 accumulators)."""
    rp = (h * R + tl.arange(0, R))[:, None] * P + tl.arange(0, P)[None, :]
    tl.atomic_add(DPHI + rp, dphi, sem="relaxed")
    tl.atomic_add(DZETA + rp, dzeta, sem="relaxed")
    tl.atomic_add(DPSI + rp, dpsi, sem="relaxed")
    tl.atomic_add(DDD + h, d_d, sem="relaxed")


# -- chunk groups: pass A (own increments), the scan, pass C (gradients) -------------------------------------
@triton.jit
def _copy_state(SRC, lim, DST, N: tl.constexpr, P: tl.constexpr, NB: tl.constexpr):
    """DST <- SRC (N×P fp32 tiles), or zeros when lim is 0."""
    for jb in range((N // 2 + NB - 1) // NB):
        lo, hi = _state_rows(SRC, lim, jb, N, P, NB)
        _store_rows(DST, lo, hi, jb, N, P, NB)


@triton.jit
def _advance_state(K, V, ADT, DT, TRAP, KB, MV, COS, SIN, SRC, DST, b, h, c,
                   S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                   R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                   PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """DST <- e^{cs_last} SRC + Σ_i e^{cs_last-cs_i} factor_i k_i ⊗ ṽ_i: the state after chunk c from the
    state before it, row block by row block (no N×P tile in registers)."""
    t0 = c * C
    g = h // (H // G)
    cs, cs_last, _gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
    vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)
    kw = tl.exp(cs_last - cs) * factor
    e_last = tl.exp(cs_last)
    for jb in range((N // 2 + NB - 1) // NB):
        cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
        klo, khi = _rot_block(K, KB, cos, sin, b, h, g, t0, jb, S, G, N, R, C, NB)
        h_lo, h_hi = _state_rows(SRC, N // 2, jb, N, P, NB)
        new_lo = _mma(tl.trans(klo * kw[:, None]), vt, e_last * h_lo, PREC_ROT, LOWP, INTERP)
        new_hi = _mma(tl.trans(khi * kw[:, None]), vt, e_last * h_hi, PREC_ROT, LOWP, INTERP)
        _store_rows(DST, new_lo, new_hi, jb, N, P, NB)


@triton.jit
def group_local_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, COS, SIN, BUF_H, BUF_D, DECAY,
                       S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                       R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, GC: tl.constexpr,
                       PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Grid (NG, B*H), NG = S / (C*GC): each group of GC chunks' own increments, from zero at its edges.

    BUF_H[g] gets the state at the group's end, BUF_D[g] the gradient of the state before it (both as if
    nothing came before / after the group), DECAY[g] the group's total decay. With GC = 1 the increments are
    written once; otherwise they accumulate chunk by chunk in place.
    """
    NG: tl.constexpr = S // (C * GC)
    grp = tl.program_id(0)
    pid = tl.program_id(1)
    b = pid // H
    h = pid % H
    qk_group = h // (H // G)
    dst = (pid.to(tl.int64) * NG + grp) * N * P  # 64-bit: B*H*NG*N*P state elements
    if GC > 1:
        _copy_state(BUF_H, 0, BUF_H + dst, N, P, NB)
        _copy_state(BUF_D, 0, BUF_D + dst, N, P, NB)
    decay = tl.sum(tl.zeros((1,), dtype=tl.float32), axis=0) + 1.0
    for k in range(GC):
        t0 = (grp * GC + k) * C
        cs, cs_last, _gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
        vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)
        dy = _dy(DOUT, Z, MO, MZ, b, h, t0, S, H, P, R, C)
        e_last = tl.exp(cs_last)
        kw = tl.exp(cs_last - cs) * factor
        qw = tl.exp(cs) * decay  # decay of the earlier chunks of the group, seen from its start
        if GC > 1:
            tl.debug_barrier()  # the previous chunk's updates of BUF_H/BUF_D[dst] by other threads
        for jb in range((N // 2 + NB - 1) // NB):
            cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
            klo, khi = _rot_block(K, KB, cos, sin, b, h, qk_group, t0, jb, S, G, N, R, C, NB)
            qlo, qhi = _rot_block(Q, QB, cos, sin, b, h, qk_group, t0, jb, S, G, N, R, C, NB)
            if GC > 1:  # accumulate onto the group's running increments
                h_lo, h_hi = _state_rows(BUF_H + dst, N // 2, jb, N, P, NB)
                d_lo, d_hi = _state_rows(BUF_D + dst, N // 2, jb, N, P, NB)
                h_lo = e_last * h_lo
                h_hi = e_last * h_hi
            else:
                h_lo = tl.zeros((NB, P), dtype=tl.float32)
                h_hi = tl.zeros((NB, P), dtype=tl.float32)
                d_lo = tl.zeros((NB, P), dtype=tl.float32)
                d_hi = tl.zeros((NB, P), dtype=tl.float32)
            new_lo = _mma(tl.trans(klo * kw[:, None]), vt, h_lo, PREC_ROT, LOWP, INTERP)
            new_hi = _mma(tl.trans(khi * kw[:, None]), vt, h_hi, PREC_ROT, LOWP, INTERP)
            _store_rows(BUF_H + dst, new_lo, new_hi, jb, N, P, NB)
            new_lo = _mma(tl.trans(qlo * qw[:, None]), dy, d_lo, PREC_ROT, LOWP, INTERP)
            new_hi = _mma(tl.trans(qhi * qw[:, None]), dy, d_hi, PREC_ROT, LOWP, INTERP)
            _store_rows(BUF_D + dst, new_lo, new_hi, jb, N, P, NB)
        decay = decay * e_last
    tl.store(DECAY + pid * NG + grp, decay)


@triton.jit
def _linear_combine(a1, x1, a2, x2):
    return a1 * a2, a2 * x1 + x2


@triton.jit
def _scan_one(BUF, DECAY, pid, e, REVERSE: tl.constexpr, NC: tl.constexpr, NP: tl.constexpr,
              KC: tl.constexpr, BLOCK: tl.constexpr):
    """In place: x_c <- a_c * x_{c-1} + x_c over chunks (or from the last chunk down when REVERSE)."""
    k = tl.arange(0, KC)
    carry = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range((NC + KC - 1) // KC):
        if REVERSE:
            cidx = NC - 1 - (i * KC + k)
            ok = cidx >= 0
        else:
            cidx = i * KC + k
            ok = cidx < NC
        a = tl.load(DECAY + pid * NC + cidx, mask=ok, other=1.0)
        ptrs = BUF + (pid.to(tl.int64) * NC + cidx)[:, None] * NP + e[None, :]
        msk = ok[:, None] & (e < NP)[None, :]
        x = tl.load(ptrs, mask=msk, other=0.0)
        aa, xx = tl.associative_scan((tl.broadcast_to(a[:, None], (KC, BLOCK)), x), 0, _linear_combine)
        xx = xx + aa * carry[None, :]
        tl.store(ptrs, xx, mask=msk)
        carry = tl.sum(tl.where((k == KC - 1)[:, None], xx, 0.0), axis=0)


@triton.jit
def state_scan_kernel(BUF_H, BUF_D, DECAY, NC: tl.constexpr, NP: tl.constexpr, KC: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Grid (B*H, cdiv(N*P, BLOCK)): states after each chunk (forward) and state gradients (backward)."""
    pid = tl.program_id(0)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _scan_one(BUF_H, DECAY, pid, e, False, NC, NP, KC, BLOCK)
    _scan_one(BUF_D, DECAY, pid, e, True, NC, NP, KC, BLOCK)


@triton.jit
def state_walk_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, COS, SIN, BUF_H, BUF_D,
                      S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                      R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, PB: tl.constexpr,
                      PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Grid (B*H, pair blocks * P/PB column blocks, 2): pass A and the scan in one, for one-chunk groups.

    Program (b·h, block, 0) walks the chunks forward carrying rows j, N/2 + j (j in its pair block) and
    columns [p0, p0 + PB) of the state, and stores the state after each chunk in BUF_H (what the scan would
    leave there); program (b·h, block, 1) walks them backward carrying the state gradient into BUF_D. Each
    chunk's increment is pass A's (:func:`group_local_kernel` at GC = 1), added to the carried tile decayed
    by the chunk: the states are written once instead of written, read and written again by the scan, at
    the price of a chain of S / C dependent steps per program (its loads do not depend on the carry).
    """
    NC: tl.constexpr = S // C
    NPB: tl.constexpr = P // PB
    pid = tl.program_id(0)
    jb = tl.program_id(1) // NPB
    p0 = (tl.program_id(1) % NPB) * PB
    b = pid // H
    h = pid % H
    qk_group = h // (H // G)
    slot0 = pid.to(tl.int64) * NC  # 64-bit: B*H*NC*N*P state elements (and c*N*P alone can pass 2**31)
    lo = tl.zeros((NB, PB), dtype=tl.float32)
    hi = tl.zeros((NB, PB), dtype=tl.float32)
    if tl.program_id(2) == 0:
        for c in range(NC):
            t0 = c * C
            cs, cs_last, _gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
            vt = _rows_cols(V, b, h, t0, p0, S, H, P, PB, R, C) * _param_cols(MV, h, p0, P, PB, R, C)
            kw = tl.exp(cs_last - cs) * factor
            cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
            klo, khi = _rot_block(K, KB, cos, sin, b, h, qk_group, t0, jb, S, G, N, R, C, NB)
            e_last = tl.exp(cs_last)
            lo = _mma(tl.trans(klo * kw[:, None]), vt, e_last * lo, PREC_ROT, LOWP, INTERP)
            hi = _mma(tl.trans(khi * kw[:, None]), vt, e_last * hi, PREC_ROT, LOWP, INTERP)
            _store_cols(BUF_H + (slot0 + c) * N * P, lo, hi, jb, p0, N, P, NB, PB)
    else:
        for i in range(NC):
            c = NC - 1 - i
            t0 = c * C
            cs, cs_last, _gamma, _factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
            dy = _dy_cols(DOUT, Z, MO, MZ, b, h, t0, p0, S, H, P, PB, R, C)
            qw = tl.exp(cs)
            cos, sin = _cs_block(COS, SIN, b, h, t0, jb, S, H, R, A, C, NB)
            qlo, qhi = _rot_block(Q, QB, cos, sin, b, h, qk_group, t0, jb, S, G, N, R, C, NB)
            e_last = tl.exp(cs_last)
            lo = _mma(tl.trans(qlo * qw[:, None]), dy, e_last * lo, PREC_ROT, LOWP, INTERP)
            hi = _mma(tl.trans(qhi * qw[:, None]), dy, e_last * hi, PREC_ROT, LOWP, INTERP)
            _store_cols(BUF_D + (slot0 + c) * N * P, lo, hi, jb, p0, N, P, NB, PB)


@triton.jit
def _store_cols(PTR, lo, hi, jb, p0, N: tl.constexpr, P: tl.constexpr, NB: tl.constexpr, PB: tl.constexpr):
    """Rows j and N/2 + j (j in pair block jb, j < N/2), columns [p0, p0 + PB) of an N×P fp32 state."""
    j = jb * NB + tl.arange(0, NB)
    off = j[:, None] * P + (p0 + tl.arange(0, PB))[None, :]
    m = (j < N // 2)[:, None]
    tl.store(PTR + off, lo, mask=m)
    tl.store(PTR + off + (N // 2) * P, hi, mask=m)


@triton.jit
def group_bwd_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, BUF_H, BUF_D,
                     LOCAL, DSTATE, DV, DZ, DADT, DTH, DFAC, DGAM, DQ, DK, DPHI, DZETA, DPSI, DDD, DQB, DKB,
                     S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                     R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, GC: tl.constexpr,
                     PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Grid (NG, B*H): every gradient of a group of GC chunks of one (b, h).

    BUF_H[g-1] is the state before the group and BUF_D[g+1] the gradient of the state after it (both
    scanned; unused when there is one group). GC = 1 reads them directly. Otherwise the program first walks
    its chunks forward writing the state before each into LOCAL (B*H*NG, GC, N, P), then walks them
    backward carrying the state gradient through two N×P slots of DSTATE (B*H*NG, 2, N, P), with a barrier
    between chunks since other threads read what one wrote. GC = S / C is the fused variant.
    """
    NG: tl.constexpr = S // (C * GC)
    NP: tl.constexpr = N * P
    ATOMIC: tl.constexpr = H // G > 1
    grp = tl.program_id(0)
    pid = tl.program_id(1)
    b = pid // H
    h = pid % H
    base = pid.to(tl.int64) * NG  # 64-bit state offsets
    prev_lim = tl.where(grp > 0, N // 2, 0)
    next_lim = tl.where(grp < NG - 1, N // 2, 0)
    if GC == 1:
        dphi, dzeta, dpsi, d_d, _cs_last = _chunk_bwd(
            Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, DV, DZ, DADT, DTH, DFAC, DGAM,
            DQ, DK, DQB, DKB, BUF_H + (base + grp - 1) * NP, prev_lim,
            BUF_D + (base + grp + 1) * NP, next_lim, BUF_D, b, h, grp,
            S, H, G, N, P, R, A, C, NB, ATOMIC, False, PREC, PREC_ROT, LOWP, INTERP)
    else:
        loc = LOCAL + (base + grp) * GC * NP
        _copy_state(BUF_H + (base + grp - 1) * NP, prev_lim, loc, N, P, NB)
        for k in range(GC - 1):
            tl.debug_barrier()  # LOCAL[k] was written by other threads
            _advance_state(K, V, ADT, DT, TRAP, KB, MV, COS, SIN, loc + k * NP, loc + (k + 1) * NP, b, h,
                           grp * GC + k, S, H, G, N, P, R, A, C, NB, PREC_ROT, LOWP, INTERP)
        slots = DSTATE + (base + grp) * 2 * NP
        _copy_state(BUF_D + (base + grp + 1) * NP, next_lim, slots, N, P, NB)
        dphi = tl.zeros((R, P), dtype=tl.float32)
        dzeta = tl.zeros((R, P), dtype=tl.float32)
        dpsi = tl.zeros((R, P), dtype=tl.float32)
        d_d = tl.sum(tl.zeros((1,), dtype=tl.float32), axis=0)
        for i in range(GC):
            k = GC - 1 - i
            tl.debug_barrier()  # LOCAL and the state-gradient slot were written by other threads
            cphi, czeta, cpsi, cd, _cs_last = _chunk_bwd(
                Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, DV, DZ, DADT, DTH, DFAC,
                DGAM, DQ, DK, DQB, DKB, loc + k * NP, N // 2, slots + (i % 2) * NP, N // 2,
                slots + ((i + 1) % 2) * NP, b, h, grp * GC + k, S, H, G, N, P, R, A, C, NB, ATOMIC, True,
                PREC, PREC_ROT, LOWP, INTERP)
            dphi += cphi
            dzeta += czeta
            dpsi += cpsi
            d_d += cd
    _add_params(DPHI, DZETA, DPSI, DDD, h, dphi, dzeta, dpsi, d_d, P, R)


@triton.jit
def _split2_chunk(BUF_H, BUF_D, S: tl.constexpr, H: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                  R: tl.constexpr, C: tl.constexpr):
    """The chunk of a split2 program (grid (NC, B*H)): c, b, h, its 64-bit slot among the B*H*NC chunks
    (B*H*NC*N*P state elements overflow 32 bits), the scanned state before it and the state gradient after
    it with their row limits (0: a zero tile), and the offsets of its C*R x P tile of dy scratch."""
    NC: tl.constexpr = S // C
    NP: tl.constexpr = N * P
    c = tl.program_id(0)
    pid = tl.program_id(1)
    slot = pid.to(tl.int64) * NC + c
    rows = tl.arange(0, C * R)
    dy_off = slot * (C * R) * P + rows[:, None] * P + tl.arange(0, P)[None, :]
    return (c, pid // H, pid % H, slot, BUF_H + (slot - 1) * NP, tl.where(c > 0, N // 2, 0),
            BUF_D + (slot + 1) * NP, tl.where(c < NC - 1, N // 2, 0), dy_off)


@triton.jit
def chunk_values_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, BUF_H, BUF_D,
                        SA, SDY, SHDH, DV, DZ, DPHI, DZETA, DPSI, DDD,
                        S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                        R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                        PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """split2, first kernel. Grid (NC, B*H): :func:`_chunk_values` of every chunk (states from the scan).

    Stores dV, dZ, adds the MIMO/D partials, and hands the second kernel the chunk's scores (SA, NC·C*R·C*R
    per (b, h)), dy (SDY, NC·C*R·P) and Σ Hp⊙dH (SHDH, NC), all fp32.
    """
    CR: tl.constexpr = C * R
    c, b, h, slot, hp, hp_lim, dh, dh_lim, dy_off = _split2_chunk(BUF_H, BUF_D, S, H, N, P, R, C)
    _a, hdh, dy, dphi, dzeta, dpsi, d_d = _chunk_values(
        Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, COS, SIN, DV, DZ, hp, hp_lim, dh, dh_lim,
        SA + slot * CR * CR, b, h, c, S, H, G, N, P, R, A, C, NB, PREC, LOWP, INTERP, True)
    tl.store(SDY + dy_off, dy)
    tl.store(SHDH + slot, hdh)
    _add_params(DPHI, DZETA, DPSI, DDD, h, dphi, dzeta, dpsi, d_d, P, R)


@triton.jit
def chunk_qk_kernel(Q, K, V, ADT, DT, TRAP, QB, KB, MV, COS, SIN, BUF_H, BUF_D, SA, SDY, SHDH,
                    DADT, DTH, DFAC, DGAM, DQ, DK, DQB, DKB,
                    S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                    R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                    PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """split2, second kernel. Grid (NC, B*H): :func:`_chunk_qk` of every chunk from what the first stored,
    walking the pair blocks twice (fewer spills here; not in the one-kernel variants)."""
    CR: tl.constexpr = C * R
    ATOMIC: tl.constexpr = H // G > 1
    c, b, h, slot, hp, hp_lim, dh, dh_lim, dy_off = _split2_chunk(BUF_H, BUF_D, S, H, N, P, R, C)
    rows = tl.arange(0, CR)
    a = tl.load(SA + slot * CR * CR + rows[:, None] * CR + rows[None, :])
    dy = tl.load(SDY + dy_off)
    hdh = tl.load(SHDH + slot)
    _cs_last = _chunk_qk(a, hdh, dy, Q, K, V, ADT, DT, TRAP, QB, KB, MV, COS, SIN, DADT, DTH, DFAC, DGAM,
                         DQ, DK, DQB, DKB, hp, hp_lim, dh, dh_lim, BUF_D, b, h, c,
                         S, H, G, N, P, R, A, C, NB, ATOMIC, False, PREC_ROT, LOWP, INTERP, True)


# -- epilogue ----------------------------------------------------------------------------------------------
@triton.jit
def epilogue_kernel(ANGLES, DT, TRAP, DTH, DFAC, DGAM, DANG, DDT, DTRAP,
                    S: tl.constexpr, H: tl.constexpr, A: tl.constexpr, BT: tl.constexpr, SEG: tl.constexpr,
                    INTERP: tl.constexpr):
    """Grid (B*H, S/SEG): dAngles, dDT, dTrap from the per-step scratch, one SEG-step segment per program.

    θ_t = Σ_{s≤t} π tanh(Angles_s) DT_s, so the gradient reaching step s is the sum of the angle gradients
    of every t ≥ s; σ-gated γ_t = σ_t DT_t and factor_t = γ_t + (1-σ_{t+1}) DT_{t+1} give dDT and dTrap.
    A program first sums the angle gradients of every later step (independent loads), then walks its own
    segment backward in BT-step blocks: one program per (b, h) walking all of S was a chain of S/BT
    dependent steps on B*H programs (latency-bound, ~0.18 ms on the H200).
    """
    pid = tl.program_id(0)
    seg = tl.program_id(1)
    b = pid // H
    h = pid % H
    j = tl.arange(0, A)
    end = (seg + 1) * SEG
    later = tl.zeros((BT, A), dtype=tl.float32)
    for i in range((S - end) // BT):
        t = end + i * BT + tl.arange(0, BT)
        later += tl.load(DTH + ((b * S + t) * H + h)[:, None] * A + j[None, :])
    carry = tl.sum(later, axis=0)
    for i in range(SEG // BT):
        t = end - (i + 1) * BT + tl.arange(0, BT)
        ap = ((b * S + t) * H + h)[:, None] * A + j[None, :]
        dth = tl.load(DTH + ap)
        tot = tl.sum(dth, axis=0)
        rev = tot[None, :] - tl.cumsum(dth, axis=0) + dth + carry[None, :]
        carry += tot
        th = 2.0 * tl.sigmoid(2.0 * tl.load(ANGLES + ap)) - 1.0
        sp = (b * H + h) * S + t
        dt = tl.load(DT + sp)
        tl.store(DANG + ap, rev * (3.141592653589793 * dt)[:, None] * (1.0 - th * th))
        dfac = tl.load(DFAC + sp)
        dfac_prev = tl.load(DFAC + sp - 1, mask=t >= 1, other=0.0)
        dgt = tl.load(DGAM + sp) + dfac
        sig = tl.sigmoid(tl.load(TRAP + sp).to(tl.float32))
        ddt = sig * dgt + (1.0 - sig) * dfac_prev + 3.141592653589793 * tl.sum(th * rev, axis=1)
        tl.store(DDT + sp, ddt)
        dtrap = sig * (1.0 - sig) * dt * (dgt - dfac_prev)
        tl.store(DTRAP + sp, _out(dtrap, DTRAP, INTERP))
