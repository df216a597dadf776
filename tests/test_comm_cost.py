"""α-β collective costs, link table and pipeline bubbles against hand-derived cases."""

from __future__ import annotations

import math

import pytest

from planner.distributed.collectives import Collective, price
from planner.distributed.comm_cost import (
    Algorithm,
    CollectiveKind,
    bubble_fraction,
    cheapest_algorithm,
    collective_time_s,
    hierarchical_all_reduce_s,
    in_flight_microbatches,
    link_from_collective,
)
from planner.distributed.links import LINKS, AlphaBeta, get_link
from planner.errors import DeviceSpecError, FusionPlannerError

AB = AlphaBeta(alpha_s=10e-6, beta_s_per_byte=1 / 1e9)  # 10 us, 1 GB/s
S = 1_000_000  # 1 MB


def test_ring_all_reduce_is_2_p_minus_1_over_p_s_over_b_plus_2_p_minus_1_alpha() -> None:
    # p = 4: 2*3/4 * 1e6 B / 1e9 B/s = 1.5 ms; 2*3 * 10 us = 60 us
    t = collective_time_s("all_reduce", "ring", S, 4, AB)
    assert t == pytest.approx(1.5e-3 + 60e-6)


def test_tree_all_reduce_moves_the_whole_buffer_each_of_2_log2_p_steps() -> None:
    # p = 8: 2*3 steps of (10 us + 1 ms)
    assert collective_time_s("all_reduce", "tree", S, 8, AB) == pytest.approx(6 * (10e-6 + 1e-3))
    # p = 5 rounds up to 3 levels
    assert collective_time_s("all_reduce", "tree", S, 5, AB) == pytest.approx(6 * (10e-6 + 1e-3))


def test_tree_wins_small_messages_ring_wins_large_ones() -> None:
    p = 64
    small, large = 1_000, 100_000_000
    ring_s = collective_time_s("all_reduce", "ring", small, p, AB)
    tree_s = collective_time_s("all_reduce", "tree", small, p, AB)
    assert tree_s < ring_s  # 12 steps of latency against 126
    ring_l = collective_time_s("all_reduce", "ring", large, p, AB)
    tree_l = collective_time_s("all_reduce", "tree", large, p, AB)
    assert ring_l < tree_l  # ~2 S/B against 12 S/B


def test_other_collectives_hand_derived() -> None:
    p = 4
    # all-gather of a 1 MB output: 3 steps of 250 KB
    assert collective_time_s("all_gather", "ring", S, p, AB) == pytest.approx(3 * 10e-6 + 0.75e-3)
    assert collective_time_s("reduce_scatter", "ring", S, p, AB) == pytest.approx(
        3 * 10e-6 + 0.75e-3
    )
    assert collective_time_s("all_to_all", "direct", S, p, AB) == pytest.approx(3 * 10e-6 + 0.75e-3)
    assert collective_time_s("send_recv", "direct", S, 2, AB) == pytest.approx(10e-6 + 1e-3)
    assert collective_time_s("broadcast", "tree", S, p, AB) == pytest.approx(2 * (10e-6 + 1e-3))
    # halving-doubling: ring's volume in log2 p steps
    assert collective_time_s("all_reduce", "halving_doubling", S, 8, AB) == pytest.approx(
        6 * 10e-6 + 2 * 7 / 8 * 1e-3
    )


def test_all_reduce_equals_reduce_scatter_plus_all_gather_for_ring() -> None:
    for p in (2, 3, 8):
        ar = collective_time_s("all_reduce", "ring", S, p, AB)
        rs = collective_time_s("reduce_scatter", "ring", S, p, AB)
        ag = collective_time_s("all_gather", "ring", S, p, AB)
        assert ar == pytest.approx(rs + ag)


def test_one_rank_costs_nothing() -> None:
    assert collective_time_s(CollectiveKind.ALL_REDUCE, Algorithm.RING, S, 1, AB) == 0.0


def test_hierarchical_all_reduce_hand_derived() -> None:
    intra = AlphaBeta(1e-6, 1 / 100e9)  # 100 GB/s inside a node
    inter = AlphaBeta(5e-6, 1 / 10e9)  # 10 GB/s between nodes
    per_node, nodes, s = 4, 2, 8e6
    # RS and AG inside: 3 steps each of 2 MB at 100 GB/s -> 3 us + 60 us each
    # AR across 2 nodes of a 2 MB shard: 2 steps of 1 MB at 10 GB/s -> 10 us + 200 us
    want = 2 * (3e-6 + 60e-6) + (10e-6 + 200e-6)
    assert hierarchical_all_reduce_s(s, per_node, nodes, intra, inter) == pytest.approx(want)
    # beats a flat ring over all 8 ranks on the slow link
    flat = collective_time_s("all_reduce", "ring", s, 8, inter)
    assert want < flat


def test_link_from_collective_inverts_the_formula() -> None:
    p, s = 4, 3e6
    t = collective_time_s("all_reduce", "ring", s, p, AB)
    whole = AlphaBeta(collective_time_s("all_reduce", "ring", 0, p, AB), (t - 6 * AB.alpha_s) / s)
    link = link_from_collective("all_reduce", "ring", p, whole)
    assert link.alpha_s == pytest.approx(AB.alpha_s)
    assert link.beta_s_per_byte == pytest.approx(AB.beta_s_per_byte)


def test_unknown_pairs_and_groups_are_clear_errors() -> None:
    with pytest.raises(FusionPlannerError, match="all_to_all by tree"):
        collective_time_s("all_to_all", "tree", S, 4, AB)
    with pytest.raises(FusionPlannerError, match="at least 1 rank"):
        collective_time_s("all_reduce", "ring", S, 0, AB)


def test_link_table_has_sources_and_ordered_bandwidths() -> None:
    for spec in LINKS.values():
        assert spec.sources.get("bandwidth") and spec.sources.get("alpha")
    assert (
        LINKS["nvlink4"].bandwidth_Bps > LINKS["pcie5"].bandwidth_Bps > LINKS["pcie4"].bandwidth_Bps
    )
    assert LINKS["ib-ndr"].bandwidth_Bps == 2 * LINKS["ib-hdr"].bandwidth_Bps
    assert get_link("nvlink", measured=False).name == "nvlink4"
    with pytest.raises(DeviceSpecError, match="unknown interconnect"):
        get_link("carrier-pigeon")


@pytest.mark.parametrize(("p", "m", "want"), [(4, 8, 3 / 11), (1, 4, 0.0), (8, 1, 7 / 8)])
def test_bubble_fraction_gpipe_and_1f1b(p: int, m: int, want: float) -> None:
    assert bubble_fraction("gpipe", p, m) == pytest.approx(want)
    assert bubble_fraction("1f1b", p, m) == pytest.approx(want)


def test_interleaving_shrinks_the_bubble_and_1f1b_holds_fewer_microbatches() -> None:
    assert bubble_fraction("interleaved", 4, 8, chunks=2) == pytest.approx(3 / 19)
    assert in_flight_microbatches("gpipe", 4, 16) == 16
    assert in_flight_microbatches("1f1b", 4, 16) == 4
    with pytest.raises(FusionPlannerError, match=">= 1"):
        bubble_fraction("gpipe", 0, 4)


def _ring_tree_crossover(p: int, ab: AlphaBeta) -> float:
    """The size where ring's 2(p-1)α + 2(p-1)/p·S·β meets tree's 2L·α + 2L·S·β, L = ⌈log2 p⌉."""
    lg = math.ceil(math.log2(p))
    return (2 * (p - 1) - 2 * lg) * ab.alpha_s / ((2 * lg - 2 * (p - 1) / p) * ab.beta_s_per_byte)


def test_cheapest_all_reduce_is_tree_below_the_crossover_and_ring_above() -> None:
    p = 64
    cross = _ring_tree_crossover(p, AB)  # 114 α / ((12 - 126/64) β) ~ 114 KB here
    small = cheapest_algorithm("all_reduce", cross / 2, p, AB)
    large = cheapest_algorithm("all_reduce", cross * 2, p, AB)
    assert small.algorithm is Algorithm.TREE and large.algorithm is Algorithm.RING
    assert small.seconds == pytest.approx(collective_time_s("all_reduce", "tree", cross / 2, p, AB))
    assert large.seconds == pytest.approx(collective_time_s("all_reduce", "ring", cross * 2, p, AB))
    assert [a for a, _ in small.candidates] == [Algorithm.RING, Algorithm.TREE]


def test_two_ranks_always_ring_and_ties_keep_ring() -> None:
    # p = 2: both take 2 α; ring moves S, tree 2 S
    for s in (0, 1, S):
        assert cheapest_algorithm("all_reduce", s, 2, AB).algorithm is Algorithm.RING
    # all-gather and reduce-scatter have ring alone; all-to-all direct
    assert [a for a, _ in cheapest_algorithm("all_gather", S, 8, AB).candidates] == ["ring"]
    assert cheapest_algorithm("all_to_all", S, 8, AB).algorithm is Algorithm.DIRECT


def test_across_nodes_hierarchical_competes_with_flat_algorithms_on_the_slow_link() -> None:
    intra = AlphaBeta(1e-6, 1 / 100e9)
    inter = AlphaBeta(5e-6, 1 / 10e9)
    per_node, nodes = 8, 4
    p = per_node * nodes
    for s in (1e3, 1e8):
        got = cheapest_algorithm("all_reduce", s, p, intra, per_node, inter)
        want = {
            Algorithm.RING: collective_time_s("all_reduce", "ring", s, p, inter),
            Algorithm.TREE: collective_time_s("all_reduce", "tree", s, p, inter),
            Algorithm.HIERARCHICAL: hierarchical_all_reduce_s(s, per_node, nodes, intra, inter),
        }
        assert dict(got.candidates) == pytest.approx(want)
        assert got.algorithm is min(want, key=want.__getitem__)
    # a large buffer: hierarchical sends 1/per_node of it across nodes
    big = cheapest_algorithm("all_reduce", 1e8, p, intra, per_node, inter)
    assert big.algorithm is Algorithm.HIERARCHICAL
    # within one node no hierarchical candidate
    one = cheapest_algorithm("all_reduce", 1e8, per_node, intra, per_node, inter)
    assert Algorithm.HIERARCHICAL not in dict(one.candidates)
    with pytest.raises(FusionPlannerError, match="evenly"):
        cheapest_algorithm("all_reduce", 1e8, 12, intra, per_node, inter)


def test_a_fixed_algorithm_is_priced_as_fixed() -> None:
    s = 1e8  # ring is far cheaper at this size over 64 ranks
    free = Collective(0, CollectiveKind.ALL_REDUCE, int(s), 64, Algorithm.RING)
    fixed = Collective(0, CollectiveKind.ALL_REDUCE, int(s), 64, Algorithm.TREE, fixed=True)
    assert price(free, 64, AB).algorithm is Algorithm.RING
    assert price(fixed, 64, AB).seconds == pytest.approx(
        collective_time_s("all_reduce", "tree", s, 64, AB)
    )
