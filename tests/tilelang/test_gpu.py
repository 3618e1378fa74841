"""On a CUDA device: every workload once (default config), a few variants, no allocation, torch's stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang
from tuner.measure.verify import relative_l2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TEMPLATE = Mamba2ChunkCumsumTileLang()
WARP = {"scan": "warp", "store": "direct"}


@pytest.fixture(autouse=True)
def _cuda_target(session_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_TILELANG_TARGET", "auto")  # the visible GPU


def _run_and_check(config, shape, *, seed: int = 0, stream: torch.cuda.Stream | None = None) -> None:  # type: ignore[no-untyped-def]
    fn = TEMPLATE.build(config, shape)
    inputs = TEMPLATE.make_inputs(shape, "cuda", seed)
    outputs = TEMPLATE.allocate_outputs(shape, inputs)
    for out in outputs.values():
        out.fill_(float("nan"))
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    if stream is None:
        fn(inputs, outputs)
    else:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(inputs, outputs)
        stream.synchronize()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated  # the launch allocates nothing
    ref = TEMPLATE.reference(shape, inputs)
    for spec in TEMPLATE.output_specs(shape):
        out = outputs[spec.name]
        assert not torch.isnan(out).any(), spec.name
        error = relative_l2(out, ref[spec.name])
        assert error <= spec.rtol, (spec.name, error, config.key(), shape.key())


@pytest.mark.parametrize("workload", [w.name for w in TEMPLATE.workloads])
def test_every_workload_with_the_default_config(workload: str) -> None:
    _run_and_check(TEMPLATE.space().default, TEMPLATE.workload(workload))


VARIANTS = [
    ("mamba2-1p3b-b8-s2k-dt-bias", {"layout": "hq", "vec": 4, "pad": 4, "rows": 2, "threads": 128}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"vec": 4, "pad": 0, "block_h": 16, "threads": 512, "fast_math": True}),
    # masked last head block: 80 = 2·32 + 16
    ("mamba2-2p7b-b2-s32k-dt-bias", {"block_h": 32, "threads": 512}),
    ("mamba2-780m-b1-s4k", {"scan": "serial", "prefix": "serial", "block_h": 4, "threads": 128}),
    ("mamba2-1p3b-b8-s2k", {"fast_math": False, "prefix": "serial"}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"store": "direct", "sweep": "chunks"}),
    (
        "mamba2-1p3b-b8-s2k-dt-bias",
        {"store": "direct", "vec": 4, "pad": 0, "rows": 2, "block_h": 4, "threads": 128},
    ),
    ("mamba2-780m-b1-s4k", {"store": "direct", "layout": "hq", "pad": 4, "block_h": 16, "threads": 1024}),
    ("mamba2-780m-b1-s4k-dt-bias", {"block_h": 2, "rows": 4, "threads": 512, "pad": 2}),
    # looping CTAs with cp.async-pipelined raw tiles
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 4}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 5}),  # 512 CTAs: one wave at 4 CTAs per SM
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 3}),  # 2560 tiles: 854 CTAs, the last redoes two
    ("mamba2-1p3b-b8-s2k", {"persist": 16, "sweep": "chunks", "layout": "hq", "vec": 4, "pad": 4}),
    # the occupancy hint: 8 CTAs per SM (32 registers), and a looping kernel held to 5
    ("mamba2-2p7b-b2-s32k-dt-bias", {"min_blocks": 8}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"persist": 4, "min_blocks": 5}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {"load_cache": "streaming"}),
    ("mamba2-780m-b1-s4k-dt-bias", {"load_cache": "streaming", "block_h": 32, "threads": 512}),  # masked: 48
    # the warp scan (shuffles): hq with vector reads, qh, 16-lane rows on masked heads, 16-value segments,
    # looping
    ("mamba2-780m-b1-s4k", {**WARP, "layout": "hq", "pad": 4}),
    ("mamba2-1p3b-b8-s2k-dt-bias", {**WARP, "block_h": 4, "threads": 128}),
    ("mamba2-780m-b1-s4k-dt-bias", {**WARP, "block_h": 32, "threads": 512}),
    ("mamba2-1p3b-b8-s2k", {**WARP, "threads": 128, "layout": "hq", "pad": 4}),
    ("mamba2-2p7b-b2-s32k-dt-bias", {**WARP, "persist": 5}),
]


@pytest.mark.parametrize(("workload", "changes"), VARIANTS)
def test_variants(workload: str, changes: dict) -> None:
    shape = TEMPLATE.workload(workload)
    config = TEMPLATE.space().default.replace(**changes)
    assert TEMPLATE.space().check(config, shape) is None
    _run_and_check(config, shape, seed=5)


def test_runs_on_the_current_stream() -> None:
    shape = TEMPLATE.workload("mamba2-2p7b-b2-s32k-dt-bias")
    _run_and_check(TEMPLATE.space().default, shape, seed=9, stream=torch.cuda.Stream())


# The warp scan's other lane layouts, on shapes off the workloads: two chunks per CTA (rows 2), 2-value
# segments (Q = 64 over 32 lanes: pieces of 2 values per lane), 8- and 4-lane rows (several rows per warp:
# shuffles of width 8 and 4), masked heads, fp32 and bf16 outputs.
WARP_SHAPES = [
    ({"rows": 2, "layout": "hq", "pad": 4, "threads": 512}, {"B": 2, "S": 4096, "H": 24, "has_bias": True}),
    ({"layout": "hq", "pad": 4}, {"B": 2, "S": 2048, "H": 20, "Q": 64, "dtype": "float32"}),
    ({"block_h": 8, "threads": 64}, {"B": 1, "S": 2048, "H": 12, "Q": 128, "dtype": "bfloat16"}),
    ({"block_h": 16, "threads": 64, "layout": "hq", "pad": 8}, {"B": 3, "S": 1024, "H": 40, "Q": 64}),
]


@pytest.mark.parametrize(("changes", "dims"), WARP_SHAPES)
def test_warp_scan_lane_layouts(changes: dict, dims: dict) -> None:
    base = {"B": 1, "S": 2048, "H": 16, "Q": 256, "has_bias": False, "dtype": "float16", "softplus": True}
    shape = TEMPLATE.make_shape({**base, **dims})
    config = TEMPLATE.space().default.replace(**WARP, **changes)
    assert TEMPLATE.space().check(config, shape) is None, TEMPLATE.space().check(config, shape)
    _run_and_check(config, shape, seed=3)
