"""The mamba2_chunk_cumsum template: reference, inputs, search space, and the kernel under the interpreter."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import warnings

import pytest
import torch

from tuner import registry
from tuner.errors import ConfigError, ShapeError
from tuner.frozen import Config, Shape
from tuner.kernels.mamba2_chunk_cumsum.op import DA_CUMSUM_RTOL, DT_OUT_RTOL
from tuner.kernels.mamba2_chunk_cumsum.triton_launch import plan
from tuner.kernels.mamba2_chunk_cumsum.triton_template import Mamba2ChunkCumsum
from tuner.measure.verify import relative_l2

T = registry.get("mamba2_chunk_cumsum")
SPACE = T.space()
WORKLOADS = [w.name for w in T.workloads]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def run(kernel, shape: Shape, inputs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Poison the outputs, run, return the relative L2 error of every output against the reference. A
    comparator called as its users call it (mamba_ssm's wrapper) returns outputs of its own: those are
    checked then, as the measurer does."""
    outputs = T.allocate_outputs(shape, inputs)
    for t in outputs.values():
        t.fill_(float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # exp overflow of bypassed values, by design
        returned = kernel(inputs, outputs)
    if returned is not None:
        outputs = dict(returned)
    ref = T.reference(shape, inputs)
    return {name: relative_l2(outputs[name], ref[name]) for name in ref}


def assert_correct(errs: dict[str, float], shape: Shape, what: object) -> None:
    for spec in T.output_specs(shape):
        assert errs[spec.name] <= spec.rtol, f"{what}: {spec.name} error {errs[spec.name]:.3g} > {spec.rtol}"


def run_config(shape: Shape, config: Config, seed: int = 0) -> dict[str, float]:
    errs = run(T.build(config, shape), shape, T.make_inputs(shape, "cpu", seed))
    assert_correct(errs, shape, f"{shape.key()} / {config.key()}")
    return errs


def sample_layout(rng: random.Random, shape: Shape, layout: str) -> Config:
    for _ in range(1000):
        config = SPACE.sample(rng, shape)
        if config["layout"] == layout:
            return config
    raise AssertionError(f"no valid {layout} config for {shape.key()}")


# -- reference ---------------------------------------------------------------------------------------
def _loop_reference(dt, a, bias, lo, hi, q, softplus):  # type: ignore[no-untyped-def]
    """dt_out and dA_cumsum by scalar Python loops over (b, h, s), math module only."""
    b_, s_, h_ = dt.shape
    out = [[[0.0] * s_ for _ in range(h_)] for _ in range(b_)]
    cum = [[[0.0] * s_ for _ in range(h_)] for _ in range(b_)]
    for b in range(b_):
        for h in range(h_):
            running = 0.0
            for s in range(s_):
                x = float(dt[b, s, h]) + (float(bias[h]) if bias is not None else 0.0)
                if softplus and x <= 20.0:
                    x = math.log1p(math.exp(x))
                x = min(max(x, lo), hi)
                running = x * float(a[h]) if s % q == 0 else running + x * float(a[h])
                out[b][h][s], cum[b][h][s] = x, running
    return torch.tensor(out, dtype=torch.float64), torch.tensor(cum, dtype=torch.float64)


LIMITS = [(True, (1e-3, 4.0)), (True, (0.0, math.inf)), (False, (0.5, 2.0))]


@pytest.mark.parametrize("softplus,limits", LIMITS)
def test_reference_matches_scalar_loops(softplus: bool, limits: tuple[float, float]) -> None:
    raw = {"B": 2, "S": 48, "H": 3, "Q": 16, "has_bias": True, "dtype": "float32", "softplus": softplus}
    shape = T.make_shape(raw)
    inputs = T.make_inputs(shape, "cpu", 5)
    inputs["dt"][0, 0, :] = torch.tensor([25.0, 19.0, 100.0])  # both sides of the bypass, exp overflow
    inputs["dt_limit"] = torch.tensor(limits, dtype=torch.float32)
    ref = T.reference(shape, inputs)
    lo, hi = inputs["dt_limit"].double().tolist()  # the fp32 values the operator sees
    out, cum = _loop_reference(inputs["dt"], inputs["A"], inputs["dt_bias"], lo, hi, 16, softplus)
    b, h, nc, q = ref["dt_out"].shape
    assert torch.allclose(ref["dt_out"].reshape(b, h, nc * q), out, rtol=1e-12, atol=0)
    assert torch.allclose(ref["dA_cumsum"].reshape(b, h, nc * q), cum, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(ref["dt_out"]).all()


def test_inputs_are_reproducible_and_exercise_bypass_and_both_clamps() -> None:
    for name in WORKLOADS:
        shape = T.reduced(T.workload(name))
        inputs = T.make_inputs(shape, "cpu", 11)
        assert all(torch.equal(v, T.make_inputs(shape, "cpu", 11)[k]) for k, v in inputs.items())
        assert not torch.equal(inputs["dt"], T.make_inputs(shape, "cpu", 12)["dt"])
        x = inputs["dt"] + (inputs["dt_bias"] if shape["has_bias"] else 0)
        assert (x > 20).any() and (x <= 20).any(), name
        dt = T.reference(shape, inputs)["dt_out"]
        lo, hi = inputs["dt_limit"].double().tolist()
        for bound in (lo, hi):
            share = float((dt == bound).double().mean())
            assert 0.001 < share < 0.5, f"{name}: {share:.3f} of dt_out at the clamp bound {bound}"


def test_bounds_separate_rounding_from_mistakes() -> None:
    """dt_out bounds exceed the rounding error; dA_cumsum's bound catches dA taken from the rounded dt_out."""
    for name in WORKLOADS:
        for shape in (T.reduced(T.workload(name)), T.workload(name)):
            if int(shape["S"]) * int(shape["B"]) > 8192:
                continue
            inputs = T.make_inputs(shape, "cpu", 0)
            ref = T.reference(shape, inputs)
            rounded = ref["dt_out"].to(getattr(torch, str(shape["dtype"]))).double()
            assert relative_l2(rounded, ref["dt_out"]) < DT_OUT_RTOL[str(shape["dtype"])] / 1.5
            wrong = torch.cumsum(rounded * inputs["A"].double()[None, :, None, None], dim=-1)
            assert relative_l2(wrong, ref["dA_cumsum"]) > 1.5 * DA_CUMSUM_RTOL, name
            fp32_seq = torch.cumsum(ref["dt_out"].float() * inputs["A"][None, :, None, None], dim=-1)
            assert relative_l2(fp32_seq, ref["dA_cumsum"]) < DA_CUMSUM_RTOL / 20


# -- shapes, roofline -----------------------------------------------------------------------------------
def test_shape_errors() -> None:
    with pytest.raises(ShapeError, match=r"S=4100 is not a multiple of the chunk size Q=256"):
        T.make_shape({"B": 1, "S": 4100, "H": 48})
    with pytest.raises(ShapeError, match="power of two"):
        T.make_shape({"B": 1, "S": 4800, "H": 48, "Q": 96})
    with pytest.raises(ShapeError, match="dtype"):
        T.make_shape({"B": 1, "S": 4096, "H": 48, "dtype": "float64"})
    with pytest.raises(ShapeError, match="32-bit"):
        T.make_shape({"B": 1, "S": 2**24, "H": 128})
    with pytest.raises(ShapeError, match="unknown shape dim"):
        T.make_shape({"B": 1, "S": 4096, "H": 48, "N": 3})


def test_workloads_reduced_and_roofline() -> None:
    big = T.workload("mamba2-2p7b-b2-s32k-dt-bias")
    assert big.to_dict() == {
        "B": 2, "S": 32768, "H": 80, "Q": 256, "has_bias": True, "dtype": "float16", "softplus": True
    }
    assert T.bytes_moved(big) == 10 * 2 * 32768 * 80 + 80 * 4 * 2
    assert T.bytes_moved(T.workload("mamba2-780m-b1-s4k")) == 10 * 4096 * 48 + 48 * 4
    assert T.flops(big) == 3 * 2 * 32768 * 80
    for name in WORKLOADS:
        small = T.reduced(T.workload(name))
        assert T.make_shape(small.to_dict()) == small
        assert int(small["S"]) * int(small["B"]) * int(small["H"]) <= 2 * 256 * 20


# -- search space -----------------------------------------------------------------------------------------
def test_default_config_is_valid_for_every_workload_and_its_reduction() -> None:
    for name in WORKLOADS:
        for shape in (T.workload(name), T.reduced(T.workload(name))):
            assert SPACE.check(SPACE.default, shape) is None, (name, SPACE.check(SPACE.default, shape))


def test_constraints_reject_invalid_combinations() -> None:
    shape = T.workload("mamba2-780m-b1-s4k")  # H = 48
    d = SPACE.default
    assert SPACE.is_valid(d.replace(BLOCK_H=64, SPLIT=2, num_warps=8), shape)
    assert not SPACE.is_valid(d.replace(BLOCK_H=64, num_warps=8), shape)  # 64 elements per thread
    assert not SPACE.is_valid(d.replace(BLOCK_H=64, num_warps=16), shape)  # 32 per thread at 16 warps
    assert SPACE.is_valid(d.replace(BLOCK_H=32, num_warps=16), shape)
    assert not SPACE.is_valid(d.replace(BLOCK_H=128, SPLIT=4, num_warps=8), shape)  # beyond next_pow2(48)
    assert not SPACE.is_valid(d.replace(BLOCK_H=1, num_warps=16), shape)  # threads without an element
    assert not SPACE.is_valid(d.replace(BLOCK_H=64, num_warps=1), shape)  # 512 elements per thread
    assert not SPACE.is_valid(d.replace(num_stages=3), shape)  # no loop to pipeline
    assert SPACE.is_valid(d.replace(num_stages=3, persistent=2), shape)
    assert SPACE.is_valid(d.replace(SPLIT=4, num_warps=2), T.reduced(shape))  # Q=64: steps of 16 rows
    assert not SPACE.is_valid(d.replace(SPLIT=8, num_warps=1), T.reduced(shape))  # steps of 8 rows
    odd = T.make_shape({"B": 1, "S": 512, "H": 6})
    assert not SPACE.is_valid(d.replace(layout="tma"), odd)  # 24-byte rows: not TMA-aligned
    assert SPACE.is_valid(d.replace(layout="tma"), shape)
    one_block = d.replace(BLOCK_H=64, SPLIT=2, num_warps=8)
    assert not SPACE.is_valid(one_block.replace(sweep="heads"), shape)  # a single head block


def test_every_parameter_varies_among_valid_configs() -> None:
    rng = random.Random(3)
    shape = T.workload("mamba2-2p7b-b2-s32k-dt-bias")
    seen: dict[str, set[object]] = {p: set() for p in SPACE.names}
    for _ in range(400):
        for k, v in SPACE.sample(rng, shape).items():
            seen[k].add(v)
    for p in SPACE.params:
        assert len(seen[p.name]) >= 2, p.name


def test_plan_grid_and_errors() -> None:
    shape = T.workload("mamba2-2p7b-b2-s32k-dt-bias")
    d = SPACE.default
    assert plan(d, shape, 132).grid == (2 * 128 * 20,)
    assert plan(d.replace(persistent=2), shape, 132).grid == (264,)
    assert plan(d.replace(BLOCK_H=128, CHUNKS=8, persistent=8), shape, 132).grid == (2 * 16,)
    with pytest.raises(ConfigError, match="power of two"):
        plan(d.replace(BLOCK_H=3), shape, 132)
    with pytest.raises(ConfigError, match="missing"):
        plan(Config({"layout": "rows"}), shape, 132)


# -- the kernel under the interpreter -------------------------------------------------------------------
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="CPU tests run Triton's interpreter")


@needs_interpreter
@pytest.mark.parametrize("name", WORKLOADS)
def test_default_config_on_reduced_workloads(name: str) -> None:
    run_config(T.reduced(T.workload(name)), SPACE.default)


@needs_interpreter
@pytest.mark.parametrize("layout", ["rows", "tma"])
@pytest.mark.parametrize(
    "name", ["mamba2-780m-b1-s4k-dt-bias", "mamba2-1p3b-b8-s2k", "mamba2-2p7b-b2-s32k-dt-bias"]
)
def test_random_configs(layout: str, name: str) -> None:
    rng = random.Random(f"{layout}-{name}")
    shape = T.reduced(T.workload(name))
    for _ in range(3):
        run_config(shape, sample_layout(rng, shape, layout))


@needs_interpreter
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["rows", "tma"])
def test_heads_not_divisible_by_block(dtype: str, layout: str) -> None:
    """H=48 with BLOCK_H=32 (a masked or clipped second block), several chunks per tile, persistent."""
    shape = T.make_shape({"B": 2, "S": 128, "H": 48, "Q": 64, "has_bias": True, "dtype": dtype})
    config = SPACE.default.replace(layout=layout, BLOCK_H=32, CHUNKS=2, persistent=1, num_stages=2)
    assert SPACE.check(config, shape) is None
    errs = run_config(shape, config, seed=7)
    if dtype == "float32":
        assert errs["dt_out"] < 1e-6


@needs_interpreter
@pytest.mark.parametrize("layout", ["rows", "tma"])
def test_default_limits_without_softplus_and_with_overflowing_exp(layout: str) -> None:
    for softplus in (True, False):
        shape = T.make_shape(
            {"B": 1, "S": 64, "H": 8, "Q": 32, "has_bias": True, "dtype": "float32", "softplus": softplus}
        )
        inputs = T.make_inputs(shape, "cpu", 1)
        inputs["dt_limit"] = torch.tensor([0.0, math.inf])
        inputs["dt"][0, 3, 2] = 100.0  # exp(100) overflows fp32: the bypass must keep x
        config = SPACE.default.replace(layout=layout, SPLIT=2)
        errs = run(T.build(config, shape), shape, inputs)
        assert_correct(errs, shape, (layout, softplus))


@needs_interpreter
def test_wrong_kernel_is_caught() -> None:
    """The check is not vacuous: a kernel run on other inputs (dt_limit changed) misses the bounds."""
    shape = T.reduced(T.workload("mamba2-780m-b1-s4k-dt-bias"))
    inputs = T.make_inputs(shape, "cpu", 0)
    kernel = T.build(SPACE.default, shape)
    shifted = dict(inputs, dt_limit=torch.tensor([1e-3, 2.0]))
    errs = run(lambda i, o: kernel(shifted, o), shape, inputs)
    assert errs["dt_out"] > DT_OUT_RTOL["float16"] and errs["dA_cumsum"] > DA_CUMSUM_RTOL


# -- comparators -----------------------------------------------------------------------------------------
MAMBA = importlib.util.find_spec("mamba_ssm") is not None


BH = (1, 2, 4, 8, 16)


def test_comparator_lines() -> None:
    """mamba_ssm as users call it (its wrapper and its fp32 outputs), its contract variants on our buffers
    (labelled as such), and the elementwise ceiling (ungated, no competitor)."""
    lines = T.comparators()
    assert [c.name for c in lines] == (
        ["mamba_ssm-wrapper"] + [f"mamba_ssm-fp32-bh{n}" for n in BH]
        + ["mamba_ssm-tileops"] + [f"mamba_ssm-tileops-bh{n}" for n in BH]
        + [f"ceiling-block{n}" for n in (512, 1024, 2048, 4096)]
    )
    users = [c for c in lines if c.variant is None and not c.ceiling]
    assert {c.line for c in users} == {"mamba_ssm autotuned", "mamba_ssm best BLOCK_SIZE_H"}
    assert all(dict(c.contract) == {"dtype": "float32"} for c in users)
    variants = [c for c in lines if c.variant is not None]
    assert len(variants) == 6 and all(not c.contract and c.line.startswith("variant ") for c in variants)
    ceilings = [c for c in lines if c.ceiling]
    assert len(ceilings) == 4 and all(not c.gated for c in ceilings)
    shape = T.workload("mamba2-2p7b-b2-s32k-dt-bias")
    # the wrapper's fp32 dt_out moves 12 bytes per element, the template's fp16 one 10
    assert T.bytes_moved(users[0].contract_shape(shape)) - T.bytes_moved(shape) == 2 * 2 * 32768 * 80
    if not MAMBA:
        for line in lines[:-4]:
            reason = line.unavailable(T.workload(WORKLOADS[0]))
            assert reason is not None and "mamba_ssm" in reason


@needs_interpreter
def test_ceiling_kernel_moves_the_template_bytes_under_interpreter() -> None:
    """The ceiling kernel copies dt into dA_cumsum (fp32) and dt_out (the shape's dtype), flat."""
    shape = T.reduced(T.workload("mamba2-2p7b-b2-s32k-dt-bias"))
    inputs = T.make_inputs(shape, "cpu", 1)
    for line in [c for c in T.comparators() if c.ceiling][:2]:
        outputs = T.allocate_outputs(shape, inputs)
        for t in outputs.values():
            t.fill_(float("nan"))
        assert line.build(shape)(inputs, outputs) is None
        flat = inputs["dt"].reshape(-1)
        assert torch.equal(outputs["dA_cumsum"].reshape(-1), flat)
        assert torch.equal(outputs["dt_out"].reshape(-1), flat.to(torch.float16))


@needs_interpreter
@pytest.mark.skipif(not MAMBA, reason="mamba_ssm is not installed")
def test_mamba_ssm_fixed_lines_under_interpreter() -> None:
    """Its autotuned lines need a GPU to benchmark; the fixed-BLOCK_SIZE_H lines run here, each on its
    contract's shape (fp32 outputs as users get them, or our buffers for the variants)."""
    base = T.reduced(T.workload("mamba2-1p3b-b8-s2k-dt-bias"))
    for line in T.comparators():
        if "-bh" in line.name and line.unavailable(base) is None:
            shape = line.contract_shape(base)
            inputs = T.make_inputs(shape, "cpu", 2)
            assert_correct(run(line.build(shape), shape, inputs), shape, line.name)


# -- on a GPU (run with TRITON_INTERPRET=0) --------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(), reason="needs CUDA and TRITON_INTERPRET=0")
@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_on_gpu(name: str) -> None:
    shape = T.workload(name)
    rng = random.Random(name)
    configs = [SPACE.default] + [sample_layout(rng, shape, lay) for lay in ("rows", "tma", "rows", "tma")]
    for config in configs:
        errs = run(T.build(config, shape), shape, T.make_inputs(shape, "cuda", 0))
        assert_correct(errs, shape, config.key())
    for line in T.comparators():
        if line.unavailable(shape) is None:
            # on its own contract (mamba_ssm's fp32 outputs); a line the correctness gate leaves alone (the
            # elementwise ceiling: the template's bytes, none of its math) must run, its values are not checked
            at = line.contract_shape(shape)
            errs = run(line.build(at), at, T.make_inputs(at, "cuda", 0))
            if line.gated:
                assert_correct(errs, at, line.name)


def test_template_identity() -> None:
    assert isinstance(T, Mamba2ChunkCumsum)
    assert T.backend == "triton" and {o.name for o in T.outputs} == {"dt_out", "dA_cumsum"}
