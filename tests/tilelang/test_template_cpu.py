"""The TileLang kernels on TileLang's C target (CPU) at reduced sizes, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from tuner.frozen import Shape
from tuner.measure.compile_cache import CompileFailed, default_cache
from tuner.measure.verify import relative_l2

GUARD = -7.0  # fills the memory just past each output: a write out of bounds changes it


def _guarded(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``out``'s shape and dtype as the first half of a buffer twice its size (the second half: GUARD)."""
    buffer = torch.full((2 * out.numel(),), GUARD, dtype=out.dtype, device=out.device)
    return buffer[: out.numel()].view(out.shape).fill_(float("nan")), buffer[out.numel():]


def _check(template, config, shape: Shape, seed: int = 0) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Build, run on NaN-poisoned outputs, compare; returns the relative L2 errors. Each output is followed
    by guard memory that must stay untouched (a tile index past the last tile would write there)."""
    assert template.space().check(config, shape) is None
    fn = template.build(config, shape)
    inputs = template.make_inputs(shape, "cpu", seed)
    guarded = {k: _guarded(v) for k, v in template.allocate_outputs(shape, inputs).items()}
    outputs = {k: out for k, (out, _) in guarded.items()}
    pointers = {k: v.data_ptr() for k, v in outputs.items()}
    fn(inputs, outputs)
    assert {k: v.data_ptr() for k, v in outputs.items()} == pointers  # written in place
    for name, (_, guard) in guarded.items():
        assert bool((guard == GUARD).all()), f"{name}: written out of bounds"
    ref = template.reference(shape, inputs)
    errors = {}
    for spec in template.output_specs(shape):
        out = outputs[spec.name]
        assert not torch.isnan(out).any(), spec.name
        errors[spec.name] = relative_l2(out, ref[spec.name])
        assert errors[spec.name] <= spec.rtol, (spec.name, errors[spec.name], config.key())
    return errors


@pytest.mark.parametrize("workload", [0, 1, 2, 3, 4])
def test_default_config_on_every_reduced_workload(cpu_template, workload: int) -> None:  # type: ignore[no-untyped-def]
    shape = cpu_template.reduced(cpu_template.workload(cpu_template.workloads[workload].name))
    if shape["dtype"] == "bfloat16":
        shape = shape.replace(dtype="float16")  # the C target has no bfloat16 (see test_bfloat16_...)
    _check(cpu_template, cpu_template.space().default, shape, seed=workload)


VARIANTS = [
    # serial scan, masked heads (H=12, block_h=8), float32 output
    ({"scan": "serial", "prefix": "serial", "threads": 64}, {"H": 12, "dtype": "float32"}),
    # hq staging with vectorised stores, two chunks per CTA, no softplus, serial segment offsets
    (
        {"layout": "hq", "vec": 4, "pad": 4, "rows": 2, "threads": 128, "prefix": "serial"},
        {"H": 16, "softplus": False},
    ),
    # direct stores from registers: qh with vectorised loads, 2 chunks per CTA, masked heads (20 = 16 + 4),
    # chunk groups as blockIdx.x
    (
        {"store": "direct", "vec": 4, "pad": 0, "rows": 2, "block_h": 16, "threads": 512, "sweep": "chunks"},
        {"H": 20},
    ),
    # direct stores, hq staging, serial offsets, float32 output
    ({"store": "direct", "layout": "hq", "pad": 4, "prefix": "serial"}, {"H": 16, "dtype": "float32"}),
    # accurate softplus (log1p), float32 output (the tightest dt_out bound)
    ({"fast_math": False}, {"H": 16, "dtype": "float32"}),
    # qh staging with vectorised loads, no padding, 16 heads per CTA, bias
    ({"vec": 4, "pad": 0, "block_h": 16, "threads": 256}, {"H": 20, "has_bias": True}),
    # one head per CTA, two-level scan with 64 segments of the Q=256 chunk, 4 chunks per CTA
    ({"block_h": 1, "rows": 4, "threads": 256, "pad": 2}, {"H": 3, "Q": 256, "S": 1024}),
    # looping CTAs: 4 tiles each along the heads (tile index across head blocks, chunk groups, batches), bias
    ({"persist": 4, "block_h": 4, "threads": 128}, {"H": 16, "has_bias": True}),
    # looping CTAs along the chunks, hq staging with vector stores, float32 output
    (
        {"persist": 8, "sweep": "chunks", "layout": "hq", "vec": 4, "pad": 4, "threads": 128},
        {"H": 16, "dtype": "float32"},
    ),
    # looping CTAs, two chunks per tile, serial scan
    ({"persist": 2, "rows": 2, "scan": "serial", "prefix": "serial", "threads": 128}, {"H": 8}),
    # persist not dividing the tiles (32 tiles, 11 CTAs): the last CTA redoes its last tile, bias
    ({"persist": 3, "block_h": 4, "threads": 128}, {"H": 16, "has_bias": True}),
    # the same along the chunks with two chunks per tile (16 tiles, 4 CTAs, the last one 1 tile + 4 redone)
    ({"persist": 5, "block_h": 4, "rows": 2, "sweep": "chunks", "threads": 128}, {"H": 16}),
    # the looping kernel with direct stores from registers (a version-3 seed), 32 tiles over 7 CTAs
    ({"persist": 5, "block_h": 4, "store": "direct", "threads": 128}, {"H": 16, "has_bias": True}),
    # the occupancy hint (version 4): __launch_bounds__ on CUDA, ignored by the C target; one tile and looping
    ({"min_blocks": 8}, {"H": 16, "has_bias": True}),
    ({"persist": 4, "min_blocks": 5, "block_h": 4, "threads": 128}, {"H": 16}),
    # streaming dt loads (version 5): a CUDA cache hint, plain loads on the C target; masked heads
    ({"load_cache": "streaming"}, {"H": 12, "has_bias": True}),
    # the warp scan (version 6): on the C target the same sums through shared memory; masked heads, 16
    # segments of 4 values, and looping
    ({"scan": "warp", "store": "direct", "layout": "hq", "pad": 4}, {"H": 20, "has_bias": True}),
    ({"scan": "warp", "store": "direct", "block_h": 16, "threads": 256}, {"H": 12, "dtype": "float32"}),
    ({"scan": "warp", "store": "direct", "persist": 3, "block_h": 4, "threads": 128}, {"H": 16}),
]


@pytest.mark.parametrize(("changes", "dims"), VARIANTS)
def test_variants(cpu_template, changes: dict, dims: dict) -> None:  # type: ignore[no-untyped-def]
    base = {"B": 2, "S": 256, "H": 16, "Q": 64, "has_bias": False, "dtype": "float16", "softplus": True}
    shape = cpu_template.make_shape({**base, **dims})
    _check(cpu_template, cpu_template.space().default.replace(**changes), shape, seed=11)


def test_rebuild_is_served_from_memory(cpu_template) -> None:  # type: ignore[no-untyped-def]
    shape = cpu_template.reduced(cpu_template.workload("mamba2-780m-b1-s4k"))
    config = cpu_template.space().default
    cpu_template.build(config, shape)
    before = dict(default_cache().stats)
    cpu_template.build(config, shape)
    assert default_cache().stats["memory_hits"] == before["memory_hits"] + 1
    assert default_cache().stats["compiles"] == before["compiles"]


def test_bfloat16_does_not_compile_for_the_c_target(cpu_template) -> None:  # type: ignore[no-untyped-def]
    shape = cpu_template.reduced(cpu_template.workload("mamba2-1p3b-b8-s2k"))
    assert shape["dtype"] == "bfloat16"
    with pytest.raises(CompileFailed, match="bfloat16") as info:
        cpu_template.build(cpu_template.space().default, shape)
    assert cpu_template.is_compile_error(info.value)


# The plan-level ``load`` variants (not search-space parameters: benchmarks/h200/cumsum_load_probe.py builds them
# from plans): the raw tile copied whole into registers or shared memory, then activated. Same sums as fused.
LOAD_CASES = [
    ({"scan": "warp", "store": "direct", "layout": "hq", "pad": 4, "threads": 128},
     {"dtype": "float32", "has_bias": True}),
    ({"scan": "warp", "store": "direct", "block_h": 4, "threads": 64}, {}),
    ({"rows": 2, "layout": "hq", "pad": 4}, {"H": 8, "has_bias": True}),
]


@pytest.mark.parametrize("load", ["regs", "copy"])
@pytest.mark.parametrize(("changes", "dims"), LOAD_CASES)
def test_load_variants_of_a_plan(cpu_template, tmp_path, load: str, changes: dict, dims: dict) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import plan_for
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import _compile, _launcher
    from tuner.kernels.tilelang_toolchain import resolve_toolchain

    base = {"B": 2, "S": 256, "H": 16, "Q": 64, "has_bias": False, "dtype": "float16", "softplus": True}
    shape = cpu_template.make_shape({**base, **dims})
    config = cpu_template.space().default.replace(**changes)
    fused = plan_for(config, shape)
    assert fused.load == "fused"  # the search space's kernels are unchanged
    plan = dataclasses.replace(fused, load=load)
    fn = _launcher(_compile(plan, resolve_toolchain(), tmp_path), plan, "cpu")
    inputs = cpu_template.make_inputs(shape, "cpu", 5)
    guarded = {k: _guarded(v) for k, v in cpu_template.allocate_outputs(shape, inputs).items()}
    outputs = {k: out for k, (out, _) in guarded.items()}
    fn(inputs, outputs)
    reference = cpu_template.reference(shape, inputs)
    for spec in cpu_template.output_specs(shape):
        assert bool((guarded[spec.name][1] == GUARD).all()), f"{spec.name}: written out of bounds"
        assert relative_l2(outputs[spec.name], reference[spec.name]) <= spec.rtol, (load, spec.name)


def test_load_variant_needs_whole_tiles(cpu_template, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from tuner.errors import ConfigError
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import make_program, plan_for

    shape = cpu_template.make_shape({"B": 1, "S": 256, "H": 12, "Q": 64, "has_bias": False, "dtype": "float16"})
    plan = dataclasses.replace(plan_for(cpu_template.space().default, shape), load="regs")  # 8 heads per CTA
    with pytest.raises(ConfigError, match="block_h dividing H=12"):
        make_program(plan, cuda=False)
