"""Comparator: mamba_ssm 2.3.2.post1's own backward of the Mamba3 MIMO layer (TileLang 0.1.8 kernels).

It runs what ``_Mamba3Function.backward`` runs for a dense (not varlen) batch: the Triton decay prefix sums
(``compute_dacs_segsum_triton``), ``mamba_mimo_bwd_combined`` (the TileLang ``mamba_mimo_bwd_fwd`` and
``mamba_mimo_bwd_bwd`` kernels plus its Triton dt/trap/decay helpers and head sums), then ``angle_dt_bwd``
for the rotary angle cumsum. It receives what that backward receives: the forward inputs, the saved angle
cumsum (``AnglesCS``) and ``dOut``. Its gradients land in mamba_ssm's own buffers and are copied into the
template's outputs; those copies (a few MB) are timed with it.

mamba_ssm is imported only when a comparator kernel is built or checked, never at module import.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tuner.frozen import Shape
from tuner.kernels.mamba3_mimo.spec import OFFICIAL_SETTINGS
from tuner.template import Kernel

MAMBA_VERSION = "2.3.2.post1"
TILELANG_VERSION = "0.1.8"

# (N, P, R) -> (chunk size, threads of mamba_mimo_bwd_bwd) that mamba_ssm's tests use for these shapes.
def settings(shape: Shape) -> tuple[int, int]:
    """(chunk size, bb_threads) for a shape: mamba_ssm's test settings, else its advice (C = 64/R)."""
    key = (int(shape["N"]), int(shape["P"]), int(shape["R"]))
    if key in OFFICIAL_SETTINGS:
        return OFFICIAL_SETTINGS[key]
    return max(8, 64 // key[2]), 128 if key[0] <= 16 else 256


def unavailable(shape: Shape) -> str | None:
    """Why the comparator cannot run here for this shape, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    try:
        import tilelang
        from mamba_ssm import __version__ as mamba_version
        from mamba_ssm.ops.tilelang.mamba3 import mamba3_mimo_bwd  # noqa: F401
    except Exception as exc:  # any import failure (missing package, broken build) makes it unavailable
        return f"mamba_ssm TileLang kernels not importable: {type(exc).__name__}: {exc}"
    if not str(tilelang.__version__).startswith(TILELANG_VERSION):
        found = tilelang.__version__
        return f"needs tilelang {TILELANG_VERSION} (mamba_ssm {MAMBA_VERSION} pins it), found {found}"
    if str(mamba_version) != MAMBA_VERSION:
        return f"needs mamba_ssm {MAMBA_VERSION}, found {mamba_version}"
    heads, groups = int(shape["H"]), int(shape["G"])
    if groups not in (1, heads):
        return f"mamba_ssm's MIMO backward supports G = 1 or G = H, not G={groups}"
    chunk, bb_threads = settings(shape)
    if int(shape["S"]) % chunk:
        return f"S={shape['S']} is not a multiple of the TileLang chunk size {chunk}"
    if int(shape["N"]) == 16 and bb_threads == 256:
        return "known TileLang compile failure: N=16 with bb_threads=256 (no valid warp partition for T.gemm)"
    return None


def build(shape: Shape) -> Kernel:
    """The comparator kernel for a shape; raises ImportError where mamba_ssm is missing."""
    from mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd import mamba_mimo_bwd_combined
    from mamba_ssm.ops.triton.mamba3.angle_dt import angle_dt_bwd
    from mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils import compute_dacs_segsum_triton

    chunk, bb_threads = settings(shape)
    divisor = int(shape["rotary_divisor"])
    dtype = getattr(torch, str(shape["dtype"]))

    def run(inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
        t = inputs
        da_cs, da_cs_rev, segsum = compute_dacs_segsum_triton(t["ADT"], chunk)
        (dq, dk, dv, dadt, ddt, dtrap, dqb, dkb, dmv, dmz, dmo, dang_cs, dd, dz) = mamba_mimo_bwd_combined(
            t["dOut"], t["Q"], t["K"], t["V"], t["Q_bias"], t["K_bias"], t["MIMO_V"], t["MIMO_O"], t["Z"],
            t["MIMO_Z"], t["AnglesCS"], da_cs, da_cs_rev, t["DT"], t["Trap"], t["D"], segsum, chunk, divisor,
            dtype, bb_threads=bb_threads,
        )
        dang, ddt_angle, _ = angle_dt_bwd(
            grad_out=dang_cs, angle=t["Angles"], dt=t["DT"], has_init_state=False, chunk_size=chunk)
        torch.add(ddt, ddt_angle, out=outputs["dDT"])
        produced = {"dQ": dq, "dK": dk, "dV": dv, "dADT": dadt, "dTrap": dtrap, "dQ_bias": dqb,
                    "dK_bias": dkb, "dMIMO_V": dmv, "dMIMO_Z": dmz, "dMIMO_O": dmo, "dAngles": dang,
                    "dD": dd, "dZ": dz}
        for name, value in produced.items():
            outputs[name].copy_(value.view(outputs[name].shape))

    return run
