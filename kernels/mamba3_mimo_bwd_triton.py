"""Triton kernels of the Mamba3 MIMO backward (math in :mod:`kernels.mamba3_mimo_ref`).

One chunk of ``C`` time steps of one (batch, head) is worked on as ``C*R`` rows (row ``i`` is time ``i // R``,
rank ``i % R``). :func:`_chunk_bwd` holds every per-chunk gradient formula; it needs the state before the
chunk (``Hp``, N×P) and the gradient of the state after it (``dH``). Two ways to supply them:

* fused: :func:`fwd_states_kernel` walks the chunks forward per (batch, head) writing ``Hp``;
  :func:`fused_bwd_kernel` walks them backward carrying ``dH`` (one program per (batch, head));
* split: :func:`chunk_local_kernel` computes every chunk's own state increments in parallel,
  :func:`state_scan_kernel` runs the two linear recurrences (multiply-adds only), and
  :func:`split_bwd_kernel` runs :func:`_chunk_bwd` for every chunk in parallel.

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

PI = 3.141592653589793


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
def _mm(a, b, PREC: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """a @ b with fp32 accumulation; operand precision PREC: 0 LOWP, 1 tf32, 2 tf32x3, 3 LOWP hi+lo split.

    PREC 3 writes each operand as hi + lo in LOWP and sums hi·hi + hi·lo + lo·hi: about 16 mantissa bits
    with 16-bit tensor-core instructions only (for hardware without tf32).
    """
    if PREC == 3:
        a_hi = _mm_operand(a, LOWP, INTERP)
        b_hi = _mm_operand(b, LOWP, INTERP)
        a_lo = _mm_operand(a - a_hi.to(tl.float32), LOWP, INTERP)
        b_lo = _mm_operand(b - b_hi.to(tl.float32), LOWP, INTERP)
        acc = tl.dot(a_hi, b_lo)
        acc = tl.dot(a_lo, b_hi, acc)
        return tl.dot(a_hi, b_hi, acc)
    if INTERP:
        return tl.dot(_round(a, PREC, LOWP), _round(b, PREC, LOWP))
    if PREC == 0:
        return tl.dot(a.to(LOWP), b.to(LOWP))
    elif PREC == 1:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="tf32x3")


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
def _halves(x, M: tl.constexpr, N: tl.constexpr):
    """(M, N) -> x[:, :N/2], x[:, N/2:]."""
    lo, hi = tl.split(tl.permute(tl.reshape(x, (M, 2, N // 2)), (0, 2, 1)))
    return lo, hi


@triton.jit
def _join(lo, hi, M: tl.constexpr, N: tl.constexpr):
    """Inverse of _halves."""
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (M, N))


@triton.jit
def _fold_rank(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(C*R, X) -> (C, X): sum over the rank of each time step."""
    return tl.sum(tl.reshape(x, (C, R, X)), axis=1)


@triton.jit
def _fold_time(x, C: tl.constexpr, R: tl.constexpr, X: tl.constexpr):
    """(C*R, X) -> (R, X): sum over the time steps of the chunk."""
    return tl.sum(tl.reshape(x, (C, R, X)), axis=0)


@triton.jit
def _silu_parts(x):
    sg = tl.sigmoid(x)
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
def _cos_sin(ANG, b, h, t0, S: tl.constexpr, H: tl.constexpr, N: tl.constexpr, R: tl.constexpr,
             A: tl.constexpr, C: tl.constexpr):
    """cos/sin of the rotary angles per row, (C*R, N/2); columns j >= A do not rotate (cos 1, sin 0)."""
    ti = tl.arange(0, C * R) // R
    j = tl.arange(0, N // 2)
    off = ((b * S + t0 + ti) * H + h)[:, None] * A + j[None, :]
    th = tl.load(ANG + off, mask=(j < A)[None, :], other=0.0)
    return tl.cos(th), tl.sin(th)


@triton.jit
def _rotated(X, XB, cos, sin, b, h, g, t0,
             S: tl.constexpr, G: tl.constexpr, N: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """Biased, rotated q or k rows as fp32 halves (C*R, N/2): pairs (j, N/2+j) turn by the angle of j."""
    rows = tl.arange(0, C * R)
    ti = rows // R
    ri = rows % R
    j = tl.arange(0, N // 2)
    off = (((b * S + t0 + ti) * R + ri) * G + g)[:, None] * N + j[None, :]
    boff = (h * R + ri)[:, None] * N + j[None, :]
    lo = tl.load(X + off).to(tl.float32) + tl.load(XB + boff)
    hi = tl.load(X + off + N // 2).to(tl.float32) + tl.load(XB + boff + N // 2)
    return cos * lo - sin * hi, sin * lo + cos * hi


@triton.jit
def _rows_p(X, b, h, t0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
            C: tl.constexpr):
    """A (B,S,H,P) tensor's chunk repeated over rank rows: (C*R, P) fp32."""
    ti = tl.arange(0, C * R) // R
    p = tl.arange(0, P)
    return tl.load(X + ((b * S + t0 + ti) * H + h)[:, None] * P + p[None, :]).to(tl.float32)


@triton.jit
def _param_rows(W, h, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """A (H,R,P) parameter's rows for head h, one per chunk row: (C*R, P)."""
    ri = tl.arange(0, C * R) % R
    p = tl.arange(0, P)
    return tl.load(W + (h * R + ri)[:, None] * P + p[None, :])


@triton.jit
def _dy(DOUT, Z, MO, MZ, b, h, t0, S: tl.constexpr, H: tl.constexpr, P: tl.constexpr,
        R: tl.constexpr, C: tl.constexpr):
    """Gradient reaching y (before the gate) and the gate pieces reused by the backward."""
    dout = _rows_p(DOUT, b, h, t0, S, H, P, R, C)
    z = _rows_p(Z, b, h, t0, S, H, P, R, C)
    zeta = _param_rows(MZ, h, P, R, C)
    silu, dsilu = _silu_parts(z * zeta)
    do = dout * _param_rows(MO, h, P, R, C)
    return do * silu, do, dout, z, zeta, silu, dsilu


@triton.jit
def _state_delta(kr, vt, cs, cs_last, factor, PREC_ROT: tl.constexpr, LOWP: tl.constexpr,
                 INTERP: tl.constexpr):
    """The chunk's own contribution to the state at its end: Σ_i e^{cs_last-cs_i} factor_i k_i ⊗ v_i."""
    wf = tl.exp(cs_last - cs) * factor
    return _mm(tl.trans(kr * wf[:, None]), vt, PREC_ROT, LOWP, INTERP)


# -- the per-chunk backward --------------------------------------------------------------------------------
@triton.jit
def _chunk_bwd(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, ANG,
               DV, DZ, DADT, DTH, DFAC, DGAM,
               Hp, dH, b, h, c,
               S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
               R: tl.constexpr, A: tl.constexpr, C: tl.constexpr,
               PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Every gradient of chunk c of (b, h), given the state before it (Hp) and the state gradient after it.

    Stores dV, dZ, dADT (chunk-local reverse sum of the decay gradient) and the per-step scratch (angle,
    factor, gamma gradients). Returns dq and dk halves of this head (input space), the per-chunk partial
    sums of dMIMO_O, dMIMO_Z, dMIMO_V, dD, the chunk's contribution to the previous state gradient and the
    chunk's total log-decay.
    """
    CR: tl.constexpr = C * R
    t0 = c * C
    g = h // (H // G)
    rows = tl.arange(0, CR)
    ti = rows // R
    u = tl.arange(0, C)
    p = tl.arange(0, P)
    j = tl.arange(0, N // 2)
    d_h = tl.load(D + h)

    cs, cs_last, gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
    cos, sin = _cos_sin(ANG, b, h, t0, S, H, N, R, A, C)
    qlo, qhi = _rotated(Q, QB, cos, sin, b, h, g, t0, S, G, N, R, C)
    klo, khi = _rotated(K, KB, cos, sin, b, h, g, t0, S, G, N, R, C)
    qr = _join(qlo, qhi, CR, N)
    kr = _join(klo, khi, CR, N)
    v = _rows_p(V, b, h, t0, S, H, P, R, C)
    psi = _param_rows(MV, h, P, R, C)
    vt = v * psi
    dy, do, dout, z, zeta, silu, dsilu = _dy(DOUT, Z, MO, MZ, b, h, t0, S, H, P, R, C)

    e = tl.exp(cs)
    w = tl.exp(cs_last - cs)
    wf = w * factor
    lt = ti[:, None] > ti[None, :]
    eq = ti[:, None] == ti[None, :]
    dm = tl.exp(tl.where(lt, cs[:, None] - cs[None, :], -float("inf")))
    coef = dm * factor[None, :] + tl.where(eq, gamma[:, None], 0.0)
    a = _mm(qr, tl.trans(kr), PREC, LOWP, INTERP)
    lf = a * coef

    # Recompute y (needed by the gate and MIMO_O gradients).
    y = e[:, None] * _mm(qr, Hp, PREC, LOWP, INTERP) + _mm(lf, vt, PREC, LOWP, INTERP) + d_h * vt
    dphi = _fold_time(dout * y * silu, C, R, P)
    dzt = do * y * dsilu
    dzeta = _fold_time(dzt * z, C, R, P)
    vp = ((b * S + t0 + u) * H + h)[:, None] * P + p[None, :]
    dz = _fold_rank(dzt * zeta, C, R, P)
    tl.store(DZ + vp, _out(dz, DZ, INTERP))
    d_d = tl.sum(tl.sum(dy * vt, axis=1), axis=0)

    # Values: intra-chunk, state and D paths.
    dlf = _mm(dy, tl.trans(vt), PREC_ROT, LOWP, INTERP)
    kdh = _mm(kr, dH, PREC, LOWP, INTERP)
    dvt = d_h * dy + _mm(tl.trans(lf), dy, PREC, LOWP, INTERP) + wf[:, None] * kdh
    dv = _fold_rank(dvt * psi, C, R, P)
    tl.store(DV + vp, _out(dv, DV, INTERP))
    dpsi = _fold_time(dvt * v, C, R, P)

    # Rotated q and k.
    da = dlf * coef
    dq_inter = e[:, None] * _mm(dy, tl.trans(Hp), PREC_ROT, LOWP, INTERP)
    dqr = dq_inter + _mm(da, kr, PREC_ROT, LOWP, INTERP)
    vdh = _mm(vt, tl.trans(dH), PREC_ROT, LOWP, INTERP)
    dkr = _mm(tl.trans(da), qr, PREC_ROT, LOWP, INTERP) + wf[:, None] * vdh

    # Decay, factor and gamma gradients.
    pm = dlf * a
    kvd = tl.sum(kr * vdh, axis=1)
    x = pm * dm * factor[None, :]
    xs = wf * kvd
    g_row = tl.sum(x, axis=1) - tl.sum(x, axis=0) + tl.sum(dq_inter * qr, axis=1) - xs
    g_t = tl.sum(tl.reshape(g_row, (C, R)), axis=1)
    g_last = tl.sum(xs, axis=0) + tl.exp(cs_last) * tl.sum(tl.sum(Hp * dH, axis=1), axis=0)
    g_t = g_t + tl.where(u == C - 1, g_last, 0.0)
    dadt = tl.sum(tl.where(u[None, :] >= u[:, None], g_t[None, :], 0.0), axis=1)
    sp = (b * H + h) * S + t0 + u
    tl.store(DADT + sp, dadt)
    dfac_row = tl.sum(pm * dm, axis=0) + w * kvd
    tl.store(DFAC + sp, tl.sum(tl.reshape(dfac_row, (C, R)), axis=1))
    dgam_row = tl.sum(tl.where(eq, pm, 0.0), axis=1)
    tl.store(DGAM + sp, tl.sum(tl.reshape(dgam_row, (C, R)), axis=1))
    dh_prev = _mm(tl.trans(qr * e[:, None]), dy, PREC_ROT, LOWP, INTERP)

    # Undo the rotation; the angle gradient of each pair is Σ (d hi · lo − d lo · hi) over q and k.
    dqlo, dqhi = _halves(dqr, CR, N)
    dklo, dkhi = _halves(dkr, CR, N)
    dth = _fold_rank(dqhi * qlo - dqlo * qhi + dkhi * klo - dklo * khi, C, R, N // 2)
    ap = ((b * S + t0 + u) * H + h)[:, None] * A + j[None, :]
    tl.store(DTH + ap, dth, mask=(j < A)[None, :])
    dq_lo = cos * dqlo + sin * dqhi
    dq_hi = cos * dqhi - sin * dqlo
    dk_lo = cos * dklo + sin * dkhi
    dk_hi = cos * dkhi - sin * dklo
    return dq_lo, dq_hi, dk_lo, dk_hi, dphi, dzeta, dpsi, d_d, dh_prev, cs_last


# -- accumulation helpers ----------------------------------------------------------------------------------
@triton.jit
def _put_qk(OUT, lo, hi, b, g, t0, S: tl.constexpr, G: tl.constexpr, N: tl.constexpr, R: tl.constexpr,
            C: tl.constexpr, ATOMIC: tl.constexpr, INTERP: tl.constexpr):
    """Write (or add, when several programs share the rows) dq/dk halves into a (B,S,R,G,N) tensor."""
    rows = tl.arange(0, C * R)
    j = tl.arange(0, N // 2)
    off = (((b * S + t0 + rows // R) * R + rows % R) * G + g)[:, None] * N + j[None, :]
    if ATOMIC:
        tl.atomic_add(OUT + off, lo, sem="relaxed")
        tl.atomic_add(OUT + off + N // 2, hi, sem="relaxed")
    else:
        tl.store(OUT + off, _out(lo, OUT, INTERP))
        tl.store(OUT + off + N // 2, _out(hi, OUT, INTERP))


@triton.jit
def _add_params(DPHI, DZETA, DPSI, DDD, DQB, DKB, h, dphi, dzeta, dpsi, d_d, qb_lo, qb_hi, kb_lo, kb_hi,
                N: tl.constexpr, P: tl.constexpr, R: tl.constexpr):
    """Add one program's partial sums of the per-head parameter gradients (fp32 accumulators)."""
    r = tl.arange(0, R)
    p = tl.arange(0, P)
    j = tl.arange(0, N // 2)
    rp = (h * R + r)[:, None] * P + p[None, :]
    rn = (h * R + r)[:, None] * N + j[None, :]
    tl.atomic_add(DPHI + rp, dphi, sem="relaxed")
    tl.atomic_add(DZETA + rp, dzeta, sem="relaxed")
    tl.atomic_add(DPSI + rp, dpsi, sem="relaxed")
    tl.atomic_add(DDD + h, d_d, sem="relaxed")
    tl.atomic_add(DQB + rn, qb_lo, sem="relaxed")
    tl.atomic_add(DQB + rn + N // 2, qb_hi, sem="relaxed")
    tl.atomic_add(DKB + rn, kb_lo, sem="relaxed")
    tl.atomic_add(DKB + rn + N // 2, kb_hi, sem="relaxed")


@triton.jit
def _np_offsets(N: tl.constexpr, P: tl.constexpr):
    return tl.arange(0, N)[:, None] * P + tl.arange(0, P)[None, :]


# -- fused variant -----------------------------------------------------------------------------------------
@triton.jit
def fwd_states_kernel(K, V, ADT, DT, TRAP, KB, MV, ANG, STATES,
                      S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                      R: tl.constexpr, A: tl.constexpr, C: tl.constexpr,
                      PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """One program per (b, h): the state before every chunk, walking the chunks forward."""
    NC: tl.constexpr = S // C
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    g = h // (H // G)
    np_off = _np_offsets(N, P)
    psi = _param_rows(MV, h, P, R, C)
    state = tl.zeros((N, P), dtype=tl.float32)
    for c in range(NC):
        tl.store(STATES + (pid * NC + c) * N * P + np_off, state)
        t0 = c * C
        cs, cs_last, _gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
        cos, sin = _cos_sin(ANG, b, h, t0, S, H, N, R, A, C)
        klo, khi = _rotated(K, KB, cos, sin, b, h, g, t0, S, G, N, R, C)
        vt = _rows_p(V, b, h, t0, S, H, P, R, C) * psi
        kr = _join(klo, khi, C * R, N)
        state = tl.exp(cs_last) * state + _state_delta(kr, vt, cs, cs_last, factor, PREC_ROT, LOWP, INTERP)


@triton.jit
def fused_bwd_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, ANG, STATES,
                     DV, DZ, DADT, DTH, DFAC, DGAM, DQ, DK, DPHI, DZETA, DPSI, DDD, DQB, DKB,
                     S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                     R: tl.constexpr, A: tl.constexpr, C: tl.constexpr,
                     PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """One program per (b, h): walks the chunks backward carrying the state gradient."""
    NC: tl.constexpr = S // C
    ATOMIC: tl.constexpr = H // G > 1
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    g = h // (H // G)
    np_off = _np_offsets(N, P)
    d_state = tl.zeros((N, P), dtype=tl.float32)
    dphi = tl.zeros((R, P), dtype=tl.float32)
    dzeta = tl.zeros((R, P), dtype=tl.float32)
    dpsi = tl.zeros((R, P), dtype=tl.float32)
    qb_lo = tl.zeros((R, N // 2), dtype=tl.float32)
    qb_hi = tl.zeros((R, N // 2), dtype=tl.float32)
    kb_lo = tl.zeros((R, N // 2), dtype=tl.float32)
    kb_hi = tl.zeros((R, N // 2), dtype=tl.float32)
    d_d = tl.sum(tl.zeros((1,), dtype=tl.float32), axis=0)
    for i in range(NC):
        c = NC - 1 - i
        hp = tl.load(STATES + (pid * NC + c) * N * P + np_off)
        dq_lo, dq_hi, dk_lo, dk_hi, cphi, czeta, cpsi, cd, dh_prev, cs_last = _chunk_bwd(
            Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, ANG, DV, DZ, DADT, DTH, DFAC, DGAM,
            hp, d_state, b, h, c, S, H, G, N, P, R, A, C, PREC, PREC_ROT, LOWP, INTERP)
        _put_qk(DQ, dq_lo, dq_hi, b, g, c * C, S, G, N, R, C, ATOMIC, INTERP)
        _put_qk(DK, dk_lo, dk_hi, b, g, c * C, S, G, N, R, C, ATOMIC, INTERP)
        dphi += cphi
        dzeta += czeta
        dpsi += cpsi
        d_d += cd
        qb_lo += _fold_time(dq_lo, C, R, N // 2)
        qb_hi += _fold_time(dq_hi, C, R, N // 2)
        kb_lo += _fold_time(dk_lo, C, R, N // 2)
        kb_hi += _fold_time(dk_hi, C, R, N // 2)
        d_state = tl.exp(cs_last) * d_state + dh_prev
    _add_params(DPHI, DZETA, DPSI, DDD, DQB, DKB, h, dphi, dzeta, dpsi, d_d, qb_lo, qb_hi, kb_lo, kb_hi,
                N, P, R)


# -- split variant -----------------------------------------------------------------------------------------
@triton.jit
def chunk_local_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, ANG, BUF_H, BUF_D, DECAY,
                       S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                       R: tl.constexpr, A: tl.constexpr, C: tl.constexpr,
                       PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Grid (NC, B*H): each chunk's own increments of the state (forward) and state gradient (backward)."""
    NC: tl.constexpr = S // C
    c = tl.program_id(0)
    pid = tl.program_id(1)
    b = pid // H
    h = pid % H
    g = h // (H // G)
    t0 = c * C
    cs, cs_last, _gamma, factor = _scalars(ADT, DT, TRAP, b, h, t0, S, H, C, R)
    cos, sin = _cos_sin(ANG, b, h, t0, S, H, N, R, A, C)
    qlo, qhi = _rotated(Q, QB, cos, sin, b, h, g, t0, S, G, N, R, C)
    klo, khi = _rotated(K, KB, cos, sin, b, h, g, t0, S, G, N, R, C)
    qr = _join(qlo, qhi, C * R, N)
    kr = _join(klo, khi, C * R, N)
    vt = _rows_p(V, b, h, t0, S, H, P, R, C) * _param_rows(MV, h, P, R, C)
    dy = _dy(DOUT, Z, MO, MZ, b, h, t0, S, H, P, R, C)[0]
    np_off = _np_offsets(N, P)
    dst = (pid * NC + c) * N * P + np_off
    tl.store(BUF_H + dst, _state_delta(kr, vt, cs, cs_last, factor, PREC_ROT, LOWP, INTERP))
    tl.store(BUF_D + dst, _mm(tl.trans(qr * tl.exp(cs)[:, None]), dy, PREC_ROT, LOWP, INTERP))
    tl.store(DECAY + pid * NC + c, tl.exp(cs_last))


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
        ptrs = BUF + (pid * NC + cidx)[:, None] * NP + e[None, :]
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
def split_bwd_kernel(Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, ANG, BUF_H, BUF_D,
                     DV, DZ, DADT, DTH, DFAC, DGAM, DQ, DK, DPHI, DZETA, DPSI, DDD, DQB, DKB,
                     S: tl.constexpr, H: tl.constexpr, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr,
                     R: tl.constexpr, A: tl.constexpr, C: tl.constexpr, HB: tl.constexpr,
                     PREC: tl.constexpr, PREC_ROT: tl.constexpr, LOWP: tl.constexpr, INTERP: tl.constexpr):
    """Grid (NC, B*H/HB): chunk c of HB heads (of one q/k group), dq and dk summed over them in registers.

    BUF_H holds the state after each chunk and BUF_D the state gradient before each chunk (scanned).
    """
    NC: tl.constexpr = S // C
    CR: tl.constexpr = C * R
    ATOMIC: tl.constexpr = HB < H // G
    c = tl.program_id(0)
    pid = tl.program_id(1)
    b = pid // (H // HB)
    h0 = (pid % (H // HB)) * HB
    g = h0 // (H // G)
    np_off = _np_offsets(N, P)
    c_np = tl.zeros((N, P), dtype=tl.int32) + c
    first = c_np > 0
    last = c_np < NC - 1
    dq_lo = tl.zeros((CR, N // 2), dtype=tl.float32)
    dq_hi = tl.zeros((CR, N // 2), dtype=tl.float32)
    dk_lo = tl.zeros((CR, N // 2), dtype=tl.float32)
    dk_hi = tl.zeros((CR, N // 2), dtype=tl.float32)
    for hh in range(HB):
        h = h0 + hh
        base = (b * H + h) * NC
        hp = tl.load(BUF_H + (base + c - 1) * N * P + np_off, mask=first, other=0.0)
        dh = tl.load(BUF_D + (base + c + 1) * N * P + np_off, mask=last, other=0.0)
        hq_lo, hq_hi, hk_lo, hk_hi, cphi, czeta, cpsi, cd, _dh_prev, _cs_last = _chunk_bwd(
            Q, K, V, Z, DOUT, ADT, DT, TRAP, QB, KB, MV, MZ, MO, D, ANG, DV, DZ, DADT, DTH, DFAC, DGAM,
            hp, dh, b, h, c, S, H, G, N, P, R, A, C, PREC, PREC_ROT, LOWP, INTERP)
        dq_lo += hq_lo
        dq_hi += hq_hi
        dk_lo += hk_lo
        dk_hi += hk_hi
        _add_params(DPHI, DZETA, DPSI, DDD, DQB, DKB, h, cphi, czeta, cpsi, cd,
                    _fold_time(hq_lo, C, R, N // 2), _fold_time(hq_hi, C, R, N // 2),
                    _fold_time(hk_lo, C, R, N // 2), _fold_time(hk_hi, C, R, N // 2), N, P, R)
    _put_qk(DQ, dq_lo, dq_hi, b, g, c * C, S, G, N, R, C, ATOMIC, INTERP)
    _put_qk(DK, dk_lo, dk_hi, b, g, c * C, S, G, N, R, C, ATOMIC, INTERP)


# -- epilogue ----------------------------------------------------------------------------------------------
@triton.jit
def epilogue_kernel(ANGLES, DT, TRAP, DTH, DFAC, DGAM, DANG, DDT, DTRAP,
                    S: tl.constexpr, H: tl.constexpr, A: tl.constexpr, BT: tl.constexpr,
                    INTERP: tl.constexpr):
    """One program per (b, h): dAngles, dDT, dTrap from the per-step scratch, walking time backward.

    θ_t = Σ_{s≤t} π tanh(Angles_s) DT_s, so the gradient reaching step s is the sum of the angle gradients
    of every t ≥ s; σ-gated γ_t = σ_t DT_t and factor_t = γ_t + (1-σ_{t+1}) DT_{t+1} give dDT and dTrap.
    """
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    j = tl.arange(0, A)
    carry = tl.zeros((A,), dtype=tl.float32)
    for i in range(S // BT):
        t = S - (i + 1) * BT + tl.arange(0, BT)
        ap = ((b * S + t) * H + h)[:, None] * A + j[None, :]
        dth = tl.load(DTH + ap)
        tot = tl.sum(dth, axis=0)
        rev = tot[None, :] - tl.cumsum(dth, axis=0) + dth + carry[None, :]
        carry += tot
        th = 2.0 * tl.sigmoid(2.0 * tl.load(ANGLES + ap)) - 1.0
        sp = (b * H + h) * S + t
        dt = tl.load(DT + sp)
        tl.store(DANG + ap, rev * (PI * dt)[:, None] * (1.0 - th * th))
        dfac = tl.load(DFAC + sp)
        dfac_prev = tl.load(DFAC + sp - 1, mask=t >= 1, other=0.0)
        dgt = tl.load(DGAM + sp) + dfac
        sig = tl.sigmoid(tl.load(TRAP + sp).to(tl.float32))
        ddt = sig * dgt + (1.0 - sig) * dfac_prev + PI * tl.sum(th * rev, axis=1)
        tl.store(DDT + sp, ddt)
        dtrap = sig * (1.0 - sig) * dt * (dgt - dfac_prev)
        tl.store(DTRAP + sp, _out(dtrap, DTRAP, INTERP))
