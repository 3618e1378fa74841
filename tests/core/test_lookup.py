from __future__ import annotations

import math

from tuner.lookup import Difference, Entry, Requester, choose, shape_distance


def _entry(S: int, H: int, dtype: str = "float16", config: int = 0, at: str = "2026-01-01T00:00:00", dev: str = "H200"):
    return Entry("t", "1", {"S": S, "H": H, "dtype": dtype}, "cuda", dev, {"BLOCK_H": config}, 1.0, published_at=at)


def test_distance_is_log2_ratio_sum_plus_a_doubling_per_dtype_or_flag_difference() -> None:
    assert shape_distance({"S": 4096, "H": 48}, {"S": 4096, "H": 48}) == 0
    assert shape_distance({"S": 4096, "H": 48}, {"S": 2048, "H": 96}) == 2.0
    assert shape_distance({"S": 1, "d": "float16"}, {"S": 1, "d": "bfloat16"}) == 1.0  # same width
    assert math.isinf(shape_distance({"S": 1, "d": "float16"}, {"S": 1, "d": "float32"}))  # not
    assert shape_distance({"S": 2, "bias": True}, {"S": 1, "bias": False}) == 2.0
    assert math.isinf(shape_distance({"S": 1}, {"S": 1, "H": 2}))
    assert math.isinf(shape_distance({"S": 0}, {"S": 1}))


def test_exact_then_nearest_then_default() -> None:
    entries = [_entry(4096, 48, config=1), _entry(32768, 80, config=2)]
    a = choose({"S": 4096, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "exact" and a.config == {"BLOCK_H": 1} and a.distance == 0
    a = choose({"S": 8192, "H": 48, "dtype": "float16"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "nearest" and a.config == {"BLOCK_H": 1} and a.distance == 1.0
    a = choose({"S": 8192, "H": 48, "dtype": "float32"}, entries, default={"BLOCK_H": 9})
    assert a is not None and a.match == "default" and a.config == {"BLOCK_H": 9} and a.entry is None
    assert choose({"S": 8192, "H": 48, "dtype": "float32"}, entries, default=None) is None
    a = choose({"S": 8192, "H": 48, "dtype": "bfloat16"}, entries, default=None)  # equal width: near
    assert a is not None and a.match == "nearest" and a.distance == 2.0 and a.config == {"BLOCK_H": 1}


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


def _sw(triton: str, dev: str = "H200", S: int = 4096, config: int = 0, at: str = "2026-01-01") -> Entry:
    return Entry("t", "1", {"S": S, "H": 48, "dtype": "float16"}, "cuda", dev, {"BLOCK_H": config}, 1.0,
                 published_at=at, software={"driver": "580", "runtime": "13.0", "torch": "2.9", "triton": triton,
                                            "tilelang": "0.1"})


def test_the_requesters_device_then_software_are_preferred_over_a_nearer_shape() -> None:
    shape = {"S": 4096, "H": 48, "dtype": "float16"}
    same_shape_old = _sw("3.4", config=1)
    near_shape_ours = _sw("3.5", S=8192, config=2)
    other_device = _sw("3.5", dev="A100", config=3)
    me = Requester("H200", {"triton": "3.5", "torch": "2.9"}, backend="triton")
    a = choose(shape, [same_shape_old, near_shape_ours, other_device], default=None, requester=me)
    assert a is not None and a.config == {"BLOCK_H": 2} and a.match == "nearest" and not a.foreign
    assert a.differences == (Difference("shape.S", 4096, 8192),)
    a = choose(shape, [same_shape_old, other_device], default=None, requester=me)
    assert a is not None and a.config == {"BLOCK_H": 1} and a.match == "nearest" and a.foreign
    assert a.differences == (Difference("triton", "3.5", "3.4"),)
    a = choose(shape, [other_device], default=None, requester=me)
    assert a is not None and a.match == "nearest" and a.differences == (Difference("device_name", "H200", "A100"),)
    # A library the template's backend does not use is not compared; one the entry lacks is a difference.
    tl = Requester("H200", {"triton": "3.4", "tilelang": "9"}, backend="triton")
    assert choose(shape, [same_shape_old], default=None, requester=tl).match == "exact"  # type: ignore[union-attr]
    unknown = choose(shape, [Entry("t", "1", shape, "cuda", "H200", {"BLOCK_H": 4})], default=None,
                     requester=Requester("H200", {"triton": "3.4"}))
    assert unknown is not None and unknown.differences == (Difference("triton", "3.4", None),)
    # Nothing given: nothing compared, as before fingerprints were compared; a template version bump is never exact.
    a = choose(shape, [same_shape_old], default=None)
    assert a is not None and a.match == "exact" and a.unchecked == ("device_name", "software")
    a = choose(shape, [same_shape_old], default=None, requester=Requester(template_version="2"))
    assert a is not None and a.match == "nearest" and a.differences == (Difference("template_version", "2", "1"),)
