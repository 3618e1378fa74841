"""The Triton backward (fused and split) against the float64 reference, under the interpreter on the CPU.

With tf32x3 matmuls the interpreter computes in exact float32, so every float32 gradient must match to
~1e-6 and every 16-bit one to its output rounding; the lower precisions are emulated bit-exactly and must
stay within the template's bounds (or, for plain 16-bit operands, visibly not).
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.mimo.mimo_helpers import TEMPLATE, errors, tiny
from tuner.frozen import Config
from tuner.kernels.mamba3_mimo import reference as ref
from tuner.kernels.mamba3_mimo.bwd_template import FP32_RTOL, LOWP_OUTPUTS, LOWP_RTOL

BASE = {"variant": "split", "chunk_rows": 16, "block_n": 16, "prec": "tf32x3", "prec_rot": "tf32x3",
        "num_warps": 4, "num_stages": 1, "scan_block": 512, "scan_chunks": 8, "group_chunks": 4,
        "state_pass": "scan", "qk_warps": "same"}


def _run(shape, device, seed=0, strong=False, **overrides):
    inputs = TEMPLATE.make_inputs(shape, device, seed)
    if strong:  # faster decays and a wider trapezoid mix than the default inputs
        inputs["ADT"] = inputs["ADT"] * 8
        inputs["DT"] = inputs["DT"] * 8
        inputs["Trap"] = (inputs["Trap"].float() * 4 - 2).to(inputs["Trap"].dtype)
        inputs["AnglesCS"] = torch.remainder(
            ref.angle_cumsum(inputs["Angles"].double(), inputs["DT"].double()), 2 * torch.pi).float()
    outs = TEMPLATE.allocate_outputs(shape, inputs)
    for v in outs.values():
        v.fill_(float("nan"))
    config = TEMPLATE.space().validate_config({**BASE, **overrides})
    TEMPLATE.build(config, shape)(inputs, outs)
    cpu = {k: v.cpu() for k, v in inputs.items()}
    return errors(outs, ref.gradients(cpu, chunk=8, dtype=torch.float64))


def _split_bounds(errs, fp32_bound, lowp_bound):
    bad = {k: e for k, e in errs.items() if e > (lowp_bound if k in LOWP_OUTPUTS else fp32_bound)}
    assert not bad, f"over bound: {bad}; all: {errs}"


CASES = [
    ("fused", tiny(), {"chunk_rows": 16}),
    ("split", tiny(), {"chunk_rows": 16}),
    ("split", tiny(), {"chunk_rows": 32}),
    ("fused", tiny(R=1), {"chunk_rows": 16}),
    ("split", tiny(R=1, N=64, S=16), {"chunk_rows": 16, "block_n": 32}),
    ("fused", tiny(H=4, G=4, S=16), {"chunk_rows": 16}),  # one head per group: plain stores
    ("split", tiny(H=2, G=2, S=16, N=32), {"chunk_rows": 16}),
    ("fused", tiny(R=2, N=64, S=16), {"chunk_rows": 16}),  # two N blocks: the first rotates, not the second
    ("split", tiny(H=4, G=2, S=16), {"chunk_rows": 16}),
    ("fused", tiny(rotary_divisor=2, S=24), {"chunk_rows": 16}),
    ("split", tiny(R=4, S=16, N=32), {"chunk_rows": 32}),
    ("fused", tiny(R=8, S=16), {"chunk_rows": 64}),
    ("split2", tiny(), {"chunk_rows": 16}),
    ("split2", tiny(R=1, N=64, S=16), {"chunk_rows": 16, "block_n": 32}),
    ("split2", tiny(H=4, G=2, S=16), {"chunk_rows": 16}),
    ("split2", tiny(R=4, S=16, N=32), {"chunk_rows": 32}),
    ("split2", tiny(R=8, S=16), {"chunk_rows": 32}),  # C = 4 steps per chunk (R8's 32-row tiles)
    ("split2", tiny(R=4, S=16, N=32), {"chunk_rows": 16}),  # C = 4 at R4
    ("split", tiny(R=8, S=16), {"chunk_rows": 32}),  # C = 4 in the other variants too
    ("fused", tiny(R=4, S=16, N=32), {"chunk_rows": 16}),
    # the state walk (pass A and the scan in one): several pair and column blocks, rank 1 and 8, G < H
    ("split2", tiny(S=64), {"chunk_rows": 16, "state_pass": "walk"}),
    ("split2", tiny(R=1, N=64, S=32), {"chunk_rows": 16, "block_n": 16, "state_pass": "walk",
                                      "scan_block": 256}),  # two chunks, two pair blocks
    ("split2", tiny(H=4, G=2, S=16, P=32), {"chunk_rows": 16, "state_pass": "walk", "scan_block": 256}),
    ("split2", tiny(R=8, S=16), {"chunk_rows": 32, "state_pass": "walk", "scan_block": 1024}),
    ("split", tiny(R=4, S=16, N=32), {"chunk_rows": 16, "state_pass": "walk"}),
    ("grouped", tiny(R=4, S=64, N=32), {"chunk_rows": 16, "group_chunks": 2}),
    ("grouped", tiny(S=64), {"chunk_rows": 16, "group_chunks": 2}),  # 4 groups of 2 chunks
    ("grouped", tiny(S=64, R=1, N=32, H=4, G=2), {"chunk_rows": 16, "group_chunks": 2, "scan_chunks": 4}),
]


@pytest.mark.parametrize(("variant", "shape", "overrides"), CASES,
                         ids=[f"{v}-{s.key()}-{o['chunk_rows']}{'-walk' if o.get('state_pass') == 'walk' else ''}"
                              for v, s, o in CASES])
def test_gradients_match_reference_exactly_in_float32(device, variant, shape, overrides, monkeypatch):
    walks = _count_launches(monkeypatch, "state_walk_kernel")
    errs = _run(shape, device, variant=variant, **overrides)
    _split_bounds(errs, fp32_bound=5e-6, lowp_bound=3.5e-3)
    # every walk case has several chunks: the walk ran (and pass A and the scan did not run beside it)
    assert walks == ([1] if overrides.get("state_pass") == "walk" else [])


def _count_launches(monkeypatch, name, entry=lambda settings: 1):
    """A list that gets one entry per launch of the kernel ``name`` of the backward's module: ``entry`` of the
    launch's keyword arguments (its constants and launch settings)."""
    from tuner.kernels.mamba3_mimo import bwd_kernel

    kernel, launches = getattr(bwd_kernel, name), []

    class Counted:
        arg_names = kernel.arg_names

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(entry(kwargs))
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(bwd_kernel, name, Counted())
    return launches


@pytest.mark.parametrize("variant", ["fused", "split", "split2", "grouped"])
def test_strong_dynamics(device, variant):
    errs = _run(tiny(S=32, R=2), device, seed=5, strong=True, variant=variant, chunk_rows=16, group_chunks=2)
    _split_bounds(errs, fp32_bound=5e-6, lowp_bound=3.5e-3)


@pytest.mark.parametrize("prec", ["lowp3", "tf32"])  # the default's, and the tf32 the seeds also try
def test_default_precision_meets_the_template_bounds(device, prec):
    default = TEMPLATE.space().default
    assert default["prec"] == "lowp3" and default["prec_rot"] == "lowp3"
    errs = _run(tiny(R=4, S=16, N=32, P=32), device, seed=2, chunk_rows=32, prec=prec, prec_rot="lowp3")
    _split_bounds(errs, fp32_bound=FP32_RTOL, lowp_bound=LOWP_RTOL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's rounding emulation")
def test_plain_16bit_operands_miss_the_float32_bound(device):
    errs = _run(tiny(R=4, S=16, N=32, P=32), device, seed=2, chunk_rows=32, prec="lowp", prec_rot="lowp")
    worst = max(e for k, e in errs.items() if k not in LOWP_OUTPUTS)
    assert worst > FP32_RTOL, errs
    assert max(errs.values()) < 0.05, errs  # rounded, not broken


def test_scan_blocks_smaller_than_the_state(device):
    errs = _run(tiny(S=64, H=1, N=32), device, variant="split", chunk_rows=16, scan_block=256,
                scan_chunks=4)  # N*P = 512 states in two scan programs, 8 chunks in two steps
    _split_bounds(errs, fp32_bound=5e-6, lowp_bound=3.5e-3)


def test_rejects_a_config_whose_chunk_does_not_divide_s():
    shape = tiny(S=24, R=2)
    with pytest.raises(ValueError, match="C \\| S"):
        TEMPLATE.build(Config({**BASE, "chunk_rows": 32}), shape)


@pytest.mark.parametrize(("qk_warps", "warps"), [("half", 2), ("double", 8), ("same", 4)])
def test_split2s_q_k_kernel_runs_with_warps_of_its_own(device, monkeypatch, qk_warps, warps):
    """qk_warps launches split2's q/k kernel with half or double the value kernel's warps (and the register cap
    of that CTA size), and with ``same`` exactly as the value kernel (version 3's launch, which version 4
    carries); the gradients are the same (the interpreter ignores launch settings: the launch is the test)."""
    from tuner.kernels.mamba3_mimo.bwd_launch import register_cap

    def setting(kwargs):
        return kwargs["num_warps"], kwargs["maxnreg"], kwargs["num_stages"]

    settings = {name: _count_launches(monkeypatch, name, setting)
                for name in ("chunk_values_kernel", "chunk_qk_kernel")}
    errs = _run(tiny(S=32, P=32), device, variant="split2", chunk_rows=16, num_stages=2, qk_warps=qk_warps)
    _split_bounds(errs, fp32_bound=5e-6, lowp_bound=3.5e-3)
    assert settings == {"chunk_values_kernel": [(4, register_cap(4), 2)],
                        "chunk_qk_kernel": [(warps, register_cap(warps), 2)]}


def test_qk_warps_is_split2s_only_and_keeps_the_q_k_kernel_at_2_to_16_warps():
    space = TEMPLATE.space()
    config = Config({**BASE, "variant": "split", "qk_warps": "half"})
    assert "only split2 runs a q/k kernel" in (space.check(config, tiny()) or "")
    with pytest.raises(ValueError, match="qk_warps=half needs split2"):
        TEMPLATE.build(config, tiny())
    split2 = {**BASE, "variant": "split2"}
    assert space.is_valid(Config({**split2, "qk_warps": "half"}), tiny())  # 4 warps: a 2-warp q/k kernel
    assert "1-warp q/k kernel" in (space.check(Config({**split2, "qk_warps": "half", "num_warps": 2}), tiny()) or "")
    assert "at most 16 warps" in (space.check(Config({**split2, "qk_warps": "double", "num_warps": 16}), tiny())
                                  or "")
    assert space.is_valid(Config({**split2, "qk_warps": "double", "num_warps": 8}), tiny())
