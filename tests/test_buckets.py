"""Bucket policies: pow2, explicit edges, learned from a histogram; specs over input shapes."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.plans.buckets import (
    BucketError,
    BucketSpec,
    DynamicDim,
    Edges,
    Pow2,
    exact_key,
    learn_edges,
    parse_dynamic,
    parse_policy,
    policy_from_json,
)

SEQ_DIMS = {"B": (0, 0), "S": (0, 1)}


# ---- pow2 -------------------------------------------------------------------------------
def test_pow2_buckets_are_half_open_powers_of_two():
    p = Pow2()
    assert p.range_of(1) == (1, 1)
    assert p.range_of(2) == (2, 2)
    assert p.range_of(3) == (3, 4)
    assert p.range_of(300) == (257, 512)
    assert p.range_of(512) == (257, 512)
    assert p.range_of(513) == (513, 1024)


def test_pow2_is_clipped_to_its_declared_range_and_lists_its_buckets():
    p = Pow2(128, 4096)
    assert p.ranges() == (
        (128, 128),
        (129, 256),
        (257, 512),
        (513, 1024),
        (1025, 2048),
        (2049, 4096),
    )
    assert p.range_of(127) is None and p.range_of(4097) is None
    with pytest.raises(BucketError, match="no finite list"):
        Pow2().ranges()
    with pytest.raises(BucketError):
        Pow2(10, 5)


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(1, 5000), span=st.integers(0, 20000), pick=st.floats(0, 1))
def test_pow2_property_ranges_tile_the_range_and_stay_within_2x(lo, span, pick):
    p = Pow2(lo, lo + span)
    ranges = p.ranges()
    assert ranges[0][0] == lo and ranges[-1][1] == lo + span
    for (a, b), (c, _) in pairwise(ranges):
        assert c == b + 1 and a <= b  # consecutive, no gap, no overlap
    size = lo + int(pick * span)
    r = p.range_of(size)
    assert r is not None and r[0] <= size <= r[1] and r in ranges
    assert r[1] < 2 * size  # the representative (upper edge) is within 2x of any member


# ---- edges ------------------------------------------------------------------------------
def test_explicit_edges_and_outside_sizes():
    p = Edges((128, 512, 2048))
    assert p.ranges() == ((1, 128), (129, 512), (513, 2048))
    assert p.range_of(128) == (1, 128)
    assert p.range_of(129) == (129, 512)
    assert p.range_of(2049) is None  # outside every bucket: the caller takes the default plan
    with pytest.raises(BucketError, match="strictly increasing"):
        Edges((512, 128))
    with pytest.raises(BucketError):
        Edges(())


def test_policy_text_and_json_round_trip():
    assert parse_policy("pow2", 8, 64) == Pow2(8, 64)
    assert parse_policy("edges:128,512") == Edges((128, 512))
    for p in (Pow2(8, 64), Edges((3, 9, 27), 2, "kmeans k=3 over 5 shapes")):
        assert policy_from_json(p.to_json()) == p
    with pytest.raises(BucketError, match="unknown bucket policy"):
        parse_policy("cubes")
    with pytest.raises(BucketError, match="learned from observed shapes"):
        parse_policy("kmeans:3")


# ---- learned ----------------------------------------------------------------------------
def test_kmeans_separates_traffic_clusters_on_log_scale():
    # Short prompts around 100 tokens, long documents around 2000, a few in between.
    hist = {96: 40, 100: 80, 110: 30, 120: 10, 500: 5, 1900: 20, 2000: 60, 2100: 15}
    p = learn_edges(hist, 2)
    assert p.edges == (120, 2100)  # edges are observed sizes; the split is between clusters
    assert p.range_of(100) == (1, 120) and p.range_of(2000) == (121, 2100)
    assert p.range_of(5000) is None  # larger than anything seen: default plan + queue
    assert "kmeans k=2" in p.source
    three = learn_edges(hist, 3)
    assert three.edges == (120, 500, 2100)  # the lone 500s get their own bucket
    assert learn_edges(hist, 3) == three  # deterministic


def test_quantile_buckets_hold_similar_traffic():
    hist = {s: 1 for s in range(1, 101)}
    p = learn_edges(hist, 4, method="quantile")
    assert p.edges == (25, 50, 75, 100)
    with pytest.raises(BucketError):
        learn_edges({}, 3)
    with pytest.raises(BucketError):
        learn_edges(hist, 2, method="median")
    assert learn_edges({64: 3}, 5).edges == (64,)  # k capped at the distinct sizes


def test_learned_edges_are_clipped_to_the_declared_range():
    hist = {128: 50, 130: 20, 256: 5, 1000: 40, 1024: 30, 3000: 3, 4000: 10}
    spec = parse_dynamic("S=128..4096", SEQ_DIMS, "kmeans:3", {"S": hist})
    (pol,) = spec.policies
    assert isinstance(pol, Edges) and pol.lo == 128 and pol.edges[-1] == 4096
    assert len(pol.edges) == 3  # 4000 -> 4096 extended, not a sliver bucket of its own


# ---- specs over input shapes -------------------------------------------------------------
def test_spec_buckets_dynamic_dims_and_keeps_other_dims_exact():
    spec = parse_dynamic("S=128..4096", SEQ_DIMS)
    b = spec.bucket_of([(8, 300, 768)])
    assert b is not None and b.key == "[8,257-512,768]"
    assert b.representative() == ((8, 512, 768),)
    assert b.ranges() == {0: {1: (257, 512)}}
    assert b.contains([(8, 400, 768)]) and not b.contains([(4, 400, 768)])
    assert spec.bucket_of([(4, 300, 768)]).key == "[4,257-512,768]"  # B is not dynamic here
    assert spec.bucket_of([(8, 5000, 768)]) is None  # outside: default plan, never an error
    assert spec.bucket_of([(8, 300)]) is not None  # rank is the caller's business
    assert spec.bucket_of([(8,)]) is None  # the spec's dim does not exist


def test_spec_enumerates_buckets_for_a_tuning_job():
    spec = parse_dynamic("B=1..8,S=128..1024", SEQ_DIMS)
    buckets = spec.buckets([(8, 512, 768)])
    assert len(buckets) == 4 * 4  # B: 1,2,3-4,5-8; S: 128,129-256,257-512,513-1024
    assert len({b.key for b in buckets}) == 16
    for b in buckets:
        rep = b.representative()
        assert b.contains(rep) and rep[0][2] == 768
        assert spec.bucket_of(rep) == b
        assert spec.representative_params(b) == {"B": rep[0][0], "S": rep[0][1]}
    assert {spec.representative_params(b)["S"] for b in buckets} == {128, 256, 512, 1024}


def test_spec_json_round_trip_and_errors():
    spec = BucketSpec(
        (DynamicDim("S", 0, 1), DynamicDim("N", 1, 0)), (Pow2(1, 64), Edges((10, 20)))
    )
    again = BucketSpec.from_json(spec.to_json())
    assert again == spec
    assert again.bucket_of([(2, 33), (11,)]).key == "[2,33-64];[11-20]"
    with pytest.raises(BucketError, match="not a dimension"):
        parse_dynamic("T=1..8", SEQ_DIMS)
    with pytest.raises(BucketError, match=r"NAME=LO\.\.HI"):
        parse_dynamic("S=128", SEQ_DIMS)
    with pytest.raises(BucketError, match="LO <= HI"):
        parse_dynamic("S=512..128", SEQ_DIMS)
    with pytest.raises(BucketError, match="listed twice"):
        BucketSpec.uniform((DynamicDim("S", 0, 1), DynamicDim("T", 0, 1)))
    with pytest.raises(BucketError, match="malformed"):
        BucketSpec.from_json({"dims": [["S", 0]], "policies": []})


def test_exact_key_is_stable_text():
    assert exact_key([(8, 300, 768)]) == "[8,300,768]"
    assert exact_key([[2, 3], [4]]) == "[2,3];[4]"


def test_a_spec_renumbered_to_the_served_input_order_finds_the_same_bucket():
    """Inputs (ids, mask, decoder ids) served in the order (decoder ids, ids, mask): the
    renumbered spec and bucket describe the same shapes in the served order."""
    spec = BucketSpec.uniform((DynamicDim("S", 2, 1),), Pow2(9, 16))
    call = [(2, 12), (2, 12), (2, 16)]
    (bucket,) = spec.buckets(call)
    order = [1, 2, 0]
    served = [call[2], call[0], call[1]]
    moved = spec.renumbered(order)
    assert moved.dims == (DynamicDim("S", 0, 1),)
    assert moved.bucket_of(served) == bucket.renumbered(order, 3)
    assert bucket.renumbered(order, 3).key == "[2,9-16];[2,12];[2,12]"
    assert spec.renumbered([0, 1, None]).dims == ()  # the input that varied is gone
