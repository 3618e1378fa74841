from __future__ import annotations

import math

from tuner.service.lookup import Entry, choose, shape_distance


def _entry(S: int, H: int, dtype: str = "float16", config: int = 0, at: str = "2026-01-01T00:00:00", dev: str = "H200"):
    return Entry("t", "1", {"S": S, "H": H, "dtype": dtype}, "cuda", dev, {"BLOCK_H": config}, 1.0, published_at=at)


def test_distance_is_log2_ratio_sum_and_non_int_dims_must_match() -> None:
    assert shape_distance({"S": 4096, "H": 48}, {"S": 4096, "H": 48}) == 0
    assert shape_distance({"S": 4096, "H": 48}, {"S": 2048, "H": 96}) == 2.0
    assert math.isinf(shape_distance({"S": 1, "d": "float16"}, {"S": 1, "d": "bfloat16"}))
    assert math.isinf(shape_distance({"S": 1, "bias": True}, {"S": 1, "bias": False}))
    assert math.isinf(shape_distance({"S": 1}, {"S": 1, "H": 2}))


def test_exact_then_nearest_then_default() -> None:
    entries = [_entry(4096, 48, config=1), _entry(32768, 80, config=2)]
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "exact" and a.config == {"BLOCK_H": 1} and a.distance == 0
    a = choose({"S": 8192, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 1} and a.distance == 1.0
    a = choose({"S": 8192, "H": 48, "dtype": "bfloat16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "default" and a.config == {"BLOCK_H": 9} and a.entry is None
    assert choose({"S": 8192, "H": 48, "dtype": "bfloat16"}, entries, default=None) is None


def test_nearest_skips_configs_invalid_for_the_requested_shape() -> None:
    entries = [_entry(4096, 64, config=64), _entry(4096, 8, config=8)]
    a = choose({"S": 4096, "H": 32, "dtype": "float16"}, entries, default={"BLOCK_H": 1},
               valid=lambda c, s: c["BLOCK_H"] <= s["H"])
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 8}
    assert a.notes and "invalid for this shape" in a.notes[0]


def test_ties_go_to_the_most_recent_and_device_name_is_preferred() -> None:
    old, new = _entry(4096, 48, config=1, at="2026-01-01"), _entry(4096, 48, config=2, at="2026-02-01")
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [old, new], default=None)
    assert a is not None and a.config == {"BLOCK_H": 2}
    other = _entry(4096, 48, config=3, dev="A100", at="2026-03-01")
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, [old, other], default=None, device_name="H200")
    assert a is not None and a.config == {"BLOCK_H": 1}
