"""Fractional packings dealt in whole chunks: balanced rounding against each root's largest
remainders, and the MI250 x2 stream programs that use it."""

from __future__ import annotations

import numpy as np
import pytest

from commflow import topology
from commflow.ir import to_msccl_xml
from commflow.ir.transform import split_channels
from commflow.sim import simulate
from commflow.synth import apportion, balanced_shares, logical_edges, pack_trees, synthesize
from commflow.synth.boxes import dedicated_edges
from commflow.synth.trees import WeightedTree, tree_seconds

from ..ir.msccl_conformance import violations

MI250 = topology.load("mi250")


def _packing(topo):
    own = dedicated_edges(logical_edges(topo))
    return own, pack_trees(own)


def _largest_remainders(trees, units):
    out = []
    for root in sorted({t.root for t in trees}):
        mine = [t for t in trees if t.root == root]
        counts = apportion([t.weight for t in mine], units)
        pairs = zip(mine, counts, strict=True)
        out += [WeightedTree(t.root, t.parent, c / units) for t, c in pairs if c]
    return out


def _busiest(own, packing, trees):
    return float(tree_seconds(own, trees).max() / packing.seconds_per_byte)


def test_twelfths_load_the_busiest_link_less_than_largest_remainders():
    own, packing = _packing(MI250)  # 16 ranks, 48 trees with fractional weights
    shares = balanced_shares(own, packing.trees, 12)
    weight = {(t.root, t.parent): t.weight for t in packing.trees}
    for root in range(MI250.nranks):
        counts = [round(t.weight * 12) for t in shares if t.root == root]
        assert sum(counts) == 12 and min(counts) >= 1
    for t in shares:  # each count the floor or the ceiling of its quota
        quota = weight[(t.root, t.parent)] * 12
        assert np.floor(quota) <= round(t.weight * 12) <= np.ceil(quota)
    assert _busiest(own, packing, shares) == pytest.approx(29 / 28, rel=1e-9)
    rounded = _largest_remainders(packing.trees, 12)
    assert _busiest(own, packing, rounded) == pytest.approx(15 / 14, rel=1e-9)


def test_largest_remainders_are_kept_where_balanced_rounding_is_no_better():
    own, packing = _packing(MI250)
    shares = balanced_shares(own, packing.trees, 48)
    expected = _largest_remainders(packing.trees, 48)
    assert sorted((t.root, t.parent, t.weight) for t in shares) == sorted(
        (t.root, t.parent, t.weight) for t in expected)
    assert _busiest(own, packing, shares) == pytest.approx(113 / 112, rel=1e-9)


def test_mi250x2_stream_program_loads_its_busiest_link_as_the_balanced_shares_and_exports():
    topo = topology.load("mi250x2")
    own, packing = _packing(topo)
    program = synthesize("allgather", topo, pieces=12)
    assert dict(program.params)["packing"] == "columns"
    size = 1 << 30
    result = simulate(program, topo, size, model="flow")
    busy = max(b / link.bandwidth for b, link in zip(result.link_bytes, topo.links, strict=True))
    ratio = busy / (packing.seconds_per_byte * size / topo.nranks)
    assert ratio == pytest.approx(_busiest(own, packing, balanced_shares(own, packing.trees, 12)))
    assert ratio == pytest.approx(1.0513333333333333, rel=1e-6)
    assert _busiest(own, packing, _largest_remainders(packing.trees, 12)) > 1.095
    cut = split_channels(program, 56)  # verified on RCCL (bounded buffers) and within its rules
    assert violations(to_msccl_xml(cut, "rccl"), "rccl") == []
