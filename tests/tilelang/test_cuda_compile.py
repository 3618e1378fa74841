"""The CUDA kernels compile (TileLang lowering + nvcc for sm_90) on a host without a GPU; nothing runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc"
    ),
]
TEMPLATE = Mamba2ChunkCumsumTileLang()
WARP = {"scan": "warp", "prefix": "tree", "store": "direct"}

CASES = [
    ("mamba2-2p7b-b2-s32k-dt-bias", {}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"store": "direct", "sweep": "chunks"}),
    ("mamba2-1p3b-b8-s2k-dt-bias", {"layout": "hq", "vec": 4, "pad": 4, "rows": 2, "threads": 128}),
    ("mamba2-1p3b-b8-s2k", {"fast_math": False, "prefix": "serial", "store": "direct"}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"block_h": 32, "threads": 512, "vec": 4, "pad": 0, "fast_math": True}),
    ("mamba2-780m-b1-s4k", {"scan": "serial", "prefix": "serial", "block_h": 4, "threads": 128}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 4}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 5}),  # 512 CTAs: one wave at 4 CTAs per SM
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 3}),  # 2560 tiles: 854 CTAs, the last redoes two
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 5, "block_h": 4, "threads": 128}),  # version-3 seeds
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 5, "store": "direct"}),
    # version 4: the occupancy hint (8 CTAs of 256 threads: ptxas keeps to 32 registers; looping at 5)
    ("mamba2-2p7b-b2-s32k-dt-bias", {"min_blocks": 8}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 4, "min_blocks": 5}),
    # version 5: dt read with __ldcs (evict-first lines), also vectorised and at 8 CTAs per SM
    ("mamba2-2p7b-b2-s32k-dt-bias", {"load_cache": "streaming"}),
    ("mamba2-1p3b-b8-s2k-dt-bias", {"load_cache": "streaming", "vec": 4, "pad": 4, "min_blocks": 8}),
    # version 6: the warp scan (shuffles, one barrier per tile), hq with vector reads of the stage, qh, a
    # 16-lane row (512 threads, 32 heads: masked on 48), and looping
    ("mamba2-780m-b1-s4k", {**WARP, "layout": "hq", "pad": 4}),
    ("mamba2-1p3b-b8-s2k-dt-bias", {**WARP, "block_h": 4, "threads": 128}),
    ("mamba2-780m-b1-s4k-dt-bias", {**WARP, "block_h": 32, "threads": 512}),
    # the small-grid seeds (2026-12-05): two warps of 32-lane rows at 2 heads, 16-lane rows at 4, one head
    ("mamba2-780m-b1-s4k-dt-bias", {**WARP, "layout": "hq", "pad": 4, "block_h": 2, "threads": 64}),
    ("mamba2-780m-b1-s4k-dt-bias", {**WARP, "layout": "hq", "pad": 4, "block_h": 4, "threads": 64}),
    ("mamba2-780m-b1-s4k-dt-bias", {"store": "direct", "layout": "hq", "pad": 4, "block_h": 1, "threads": 64}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {**WARP, "persist": 5}),
]


@pytest.mark.parametrize(("workload", "changes"), CASES)
def test_compiles_for_sm90(
    session_home: Path, monkeypatch: pytest.MonkeyPatch, workload: str, changes: dict
) -> None:
    monkeypatch.setenv("TUNER_TILELANG_TARGET", "cuda:sm_90")
    shape = TEMPLATE.workload(workload)
    config = TEMPLATE.space().default.replace(**changes)
    assert TEMPLATE.space().check(config, shape) is None
    kernel, plan = TEMPLATE.compile(config, shape)  # raises CompileFailed on a lowering or nvcc error
    source = kernel.get_kernel_source()
    assert f"__launch_bounds__({plan.threads}, {plan.min_blocks or 1})" in source
    if shape["dtype"] == "bfloat16":
        assert "bfloat16" in source
    assert ("__ldcs(" in source) == (plan.load_cache == "streaming")
    # the warp scan: the totals of a row's segments move by shuffles (log2(segments) rounds and one for the
    # exclusive offset, within the row's lanes); the one-tile kernel's only barrier is after the stage
    shuffles = f"__shfl_up_sync((uint)4294967295, run[1], 1, {plan.segments})"
    assert (shuffles in source) == (plan.scan == "warp")
    if plan.scan == "warp" and plan.persist == 1:
        assert source.count("__syncthreads()") == 1
        assert source.count("__shfl_up_sync") == plan.segments.bit_length()
    if plan.persist > 1:  # the raw tiles are copied asynchronously, two stages, plain sm_90 (no setmaxnreg)
        assert "cp_async_commit" in source and "cp_async_wait" in source and "reg_alloc" not in source


@pytest.mark.parametrize("load", ["fused", "regs", "copy"])
def test_load_variants_compile_for_sm90(session_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        load: str) -> None:
    """The plan-level ``load`` variants (benchmarks/h200/cumsum_load_probe.py): regs and copy read dt with
    float4 loads (the fused load reads one float at a time); only copy stages the raw tile in shared memory."""
    import dataclasses

    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import plan_for
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import _compile
    from tuner.kernels.tilelang_toolchain import resolve_toolchain

    monkeypatch.setenv("TUNER_TILELANG_TARGET", "cuda:sm_90")
    shape = TEMPLATE.workload("mamba2-2p7b-b2-s32k-dt-bias").replace(dtype="float32")
    config = TEMPLATE.space().default.replace(**WARP, layout="hq", pad=4, threads=128, min_blocks=16)
    plan = dataclasses.replace(plan_for(config, shape), load=load)
    source = _compile(plan, resolve_toolchain(), tmp_path).get_kernel_source()
    assert ("= *(float4*)(dt + " in source) == (load != "fused")
    assert ("__shared__ __align__(16) float raw[" in source) == (load == "copy")
    assert source.count("__syncthreads()") == (2 if load == "copy" else 1)
