"""Plain-PyTorch references for the Mamba3 MIMO layer: a chunked form and a step-by-step recurrent form.

Both compute the same function (written here from the math, not taken from mamba_ssm); gradients come from
autograd. Notation per batch b, head h, time t, MIMO rank index r:

* ``q[t,r] = Q[b,t,r,g(h)] + Q_bias[h,r]`` (likewise k), with ``g(h) = h // (H // G)``;
* rotary angles ``θ[t] = Σ_{s≤t} π·tanh(Angles[b,s,h])·DT[b,h,s]`` rotate the pairs ``(j, N/2 + j)`` for
  ``j < N / rotary_divisor`` of q and k: ``x'_j = cos·x_j − sin·x_{N/2+j}``,
  ``x'_{N/2+j} = sin·x_j + cos·x_{N/2+j}``;
* trapezoidal discretisation: ``σ = sigmoid(Trap)``, ``α_t = exp(ADT_t)``, state ``H_t`` (N×P)::

      H_t = α_t H_{t-1} + α_t (1-σ_t) DT_t Σ_r k'[t-1,r] ⊗ ṽ[t-1,r] + σ_t DT_t Σ_r k'[t,r] ⊗ ṽ[t,r]

  with ``ṽ[t,r] = V[b,t,h] ⊙ MIMO_V[h,r]``;
* output ``y[t,r] = q'[t,r]·H_t + D_h ṽ[t,r]``, gated ``o = y ⊙ silu(Z[b,t,h] ⊙ MIMO_Z[h,r])`` and
  projected down ``out[b,t,h] = Σ_r o[t,r] ⊙ MIMO_O[h,r]``.

The chunked form unrolls the state: with ``factor_s = σ_s DT_s + (1-σ_{s+1}) DT_{s+1}`` (the second term 0 at
the sequence end) and ``γ_t = σ_t DT_t``,
``y[t,R] = Σ_{s<t} e^{cs_t-cs_s} factor_s Σ_r (q'[t,R]·k'[s,r]) ṽ[s,r] + γ_t Σ_r (q'[t,R]·k'[t,r]) ṽ[t,r]
+ D ṽ[t,R]``, split into chunks of ``chunk`` steps with a carried state.
Functions are pure; tensors are never modified in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

INPUT_NAMES = (
    "Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_O", "Angles", "D", "Z",
)
GRAD_NAMES = tuple(f"d{name}" for name in INPUT_NAMES)


def angle_cumsum(angles: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """θ (B, S, H, N/div): running sum over S of π·tanh(Angles)·DT (DT is (B, H, S)), in angles' dtype.

    The sum runs in float64: over thousands of steps θ grows to hundreds of radians, where float32 rounding
    would shift the rotary angles (and every gradient) by more than the error bounds being checked.
    """
    steps = torch.tanh(angles) * math.pi * dt.transpose(1, 2)[..., None]
    return torch.cumsum(steps.double(), dim=1).to(angles.dtype)


def rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (j, N/2+j) of x (..., N) by theta (..., A) for j < A; other coordinates pass through."""
    n = x.shape[-1]
    a = theta.shape[-1]
    pad = n // 2 - a
    cos = F.pad(torch.cos(theta), (0, pad), value=1.0)
    sin = F.pad(torch.sin(theta), (0, pad), value=0.0)
    lo, hi = x[..., : n // 2], x[..., n // 2 :]
    return torch.cat([cos * lo - sin * hi, sin * lo + cos * hi], dim=-1)


def _expand_groups(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, S, R, G, N) -> (B, S, R, H, N): head h reads group h // (H // G)."""
    return x.repeat_interleave(heads // x.shape[3], dim=3)


def _qk_rotated(t: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased, rotated q and k as (B, S, R, H, N)."""
    heads = t["V"].shape[2]
    theta = angle_cumsum(t["Angles"], t["DT"])[:, :, None]  # (B, S, 1, H, A)
    q = _expand_groups(t["Q"], heads) + t["Q_bias"].transpose(0, 1)[None, None]
    k = _expand_groups(t["K"], heads) + t["K_bias"].transpose(0, 1)[None, None]
    return rotate(q, theta), rotate(k, theta)


def _gate_and_project(y: torch.Tensor, t: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """y (B, S, R, H, P) -> out (B, S, H, P): SiLU(Z ⊙ MIMO_Z) gate then MIMO_O down projection."""
    z = t["Z"][:, :, None] * t["MIMO_Z"].transpose(0, 1)[None, None]
    o = y * F.silu(z)
    return torch.einsum("bsrhp,rhp->bshp", o, t["MIMO_O"].transpose(0, 1))


def forward_chunked(t: Mapping[str, torch.Tensor], chunk: int) -> torch.Tensor:
    """The MIMO layer output (B, S, H, P), computed chunk by chunk (S % chunk == 0), in t's dtype."""
    bsz, seqlen, heads, p = t["V"].shape
    rank = t["Q"].shape[2]
    if seqlen % chunk:
        raise ValueError(f"S={seqlen} is not a multiple of chunk={chunk}")
    nc = seqlen // chunk
    qr, kr = _qk_rotated(t)
    vt = t["V"][:, :, None] * t["MIMO_V"].transpose(0, 1)[None, None]  # (B, S, R, H, P)
    sig = torch.sigmoid(t["Trap"])
    gamma = t["DT"] * sig  # (B, H, S)
    factor = gamma + F.pad((t["DT"] * (1 - sig))[..., 1:], (0, 1))

    def rows(x: torch.Tensor) -> torch.Tensor:  # (B, S, R, H, X) -> (B, H, nc, C*R, X)
        x = x.permute(0, 3, 1, 2, 4).reshape(bsz, heads, nc, chunk, rank, x.shape[-1])
        return x.reshape(bsz, heads, nc, chunk * rank, x.shape[-1])

    def per_row(x: torch.Tensor) -> torch.Tensor:  # (B, H, S) -> (B, H, nc, C*R)
        return x.reshape(bsz, heads, nc, chunk, 1).expand(-1, -1, -1, -1, rank).reshape(
            bsz, heads, nc, chunk * rank)

    q_c, k_c, v_c = rows(qr), rows(kr), rows(vt)
    cs = per_row(torch.cumsum(t["ADT"].reshape(bsz, heads, nc, chunk), dim=-1).reshape(bsz, heads, seqlen))
    step = torch.arange(chunk * rank, device=cs.device) // rank
    causal = step[:, None] > step[None, :]
    same = step[:, None] == step[None, :]
    diff = (cs[..., :, None] - cs[..., None, :]).masked_fill(~causal, -math.inf)
    coef = torch.exp(diff) * per_row(factor)[..., None, :] + same * per_row(gamma)[..., :, None]
    scores = q_c @ k_c.transpose(-1, -2) * coef
    y = scores @ v_c + t["D"][None, :, None, None, None] * v_c

    # Inter-chunk: a state carried over chunk boundaries, decayed by the chunk's total ADT.
    to_end = torch.exp(cs[..., -1:] - cs) * per_row(factor)
    delta = (k_c * to_end[..., None]).transpose(-1, -2) @ v_c  # (B, H, nc, N, P)
    state = torch.zeros_like(delta[:, :, 0])
    before = []
    for c in range(nc):
        before.append(state)
        state = torch.exp(cs[:, :, c, -1])[..., None, None] * state + delta[:, :, c]
    y = y + torch.exp(cs)[..., None] * (q_c @ torch.stack(before, dim=2))
    y = y.reshape(bsz, heads, nc, chunk, rank, p).reshape(bsz, heads, seqlen, rank, p).permute(0, 2, 3, 1, 4)
    return _gate_and_project(y, t)


def forward_recurrent(t: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The same output computed one time step at a time (slow; for checking the chunked form)."""
    bsz, seqlen, heads, p = t["V"].shape
    qr, kr = _qk_rotated(t)
    vt = t["V"][:, :, None] * t["MIMO_V"].transpose(0, 1)[None, None]  # (B, S, R, H, P)
    sig = torch.sigmoid(t["Trap"])
    state = qr.new_zeros(bsz, heads, qr.shape[-1], p)
    prev_kv = torch.zeros_like(state)
    ys = []
    for s in range(seqlen):
        alpha = torch.exp(t["ADT"][:, :, s])[..., None, None]
        dt = t["DT"][:, :, s][..., None, None]
        sg = sig[:, :, s][..., None, None]
        kv = torch.einsum("brhn,brhp->bhnp", kr[:, s], vt[:, s])
        state = alpha * state + alpha * (1 - sg) * dt * prev_kv + sg * dt * kv
        prev_kv = kv
        y = torch.einsum("brhn,bhnp->brhp", qr[:, s], state) + t["D"][None, None, :, None] * vt[:, s]
        ys.append(y)
    return _gate_and_project(torch.stack(ys, dim=1), t)


def gradients(
    inputs: Mapping[str, torch.Tensor],
    *,
    chunk: int,
    dtype: torch.dtype = torch.float32,
    recurrent: bool = False,
) -> dict[str, torch.Tensor]:
    """Every input's gradient (``d<name>``, in ``dtype``) of ``Σ out ⊙ dOut`` by autograd.

    ``inputs`` holds the 14 tensors of :data:`INPUT_NAMES` and ``dOut``; they are cast to ``dtype`` and not
    modified. ``recurrent`` differentiates the step-by-step form instead of the chunked one.
    """
    leaves = {n: inputs[n].detach().to(dtype).requires_grad_(True) for n in INPUT_NAMES}
    out = forward_recurrent(leaves) if recurrent else forward_chunked(leaves, chunk)
    grads = torch.autograd.grad(out, tuple(leaves.values()), inputs["dOut"].to(dtype))
    return {f"d{n}": g for n, g in zip(INPUT_NAMES, grads, strict=True)}
