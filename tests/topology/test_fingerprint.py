"""Fingerprints are stable under renaming and reordering, and change with the network."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.topology import (
    Link,
    Node,
    NodeKind,
    dgx1,
    dgx_a100,
    dump,
    duplex,
    fat_tree,
    fingerprint,
    isomorphic,
    line,
    make_topology,
    ring,
    switch,
)
from commflow.topology.formats.json_yaml import from_dict


def shuffled_copy(topology, seed):
    """The topology re-read from its schema with new names, switches/NICs and links in a
    random order, and ranks interleaved among them (rank order kept)."""
    rng = random.Random(seed)
    data = dump(topology)
    rename = {n["name"]: f"n{rng.randrange(10**9)}-{i}" for i, n in enumerate(data["nodes"])}
    ranks = [n for n in data["nodes"] if n["kind"] == "rank"]
    others = [n for n in data["nodes"] if n["kind"] != "rank"]
    rng.shuffle(others)
    nodes = []
    while ranks or others:
        source = ranks if ranks and (not others or rng.random() < 0.5) else others
        nodes.append(source.pop(0))
    links = list(data["links"])
    rng.shuffle(links)
    return from_dict(
        {
            "name": "renamed",
            "nodes": [{**n, "name": rename[n["name"]]} for n in nodes],
            "links": [{**lk, "src": rename[lk["src"]], "dst": rename[lk["dst"]]} for lk in links],
        }
    )


def permuted_switches(topology, permutation):
    """The same topology with its non-rank node ids permuted."""
    nr = topology.nranks
    new_id = list(range(nr)) + [nr + p for p in permutation]
    nodes = sorted(
        (Node(new_id[n.id], n.kind, n.name, n.box) for n in topology.nodes), key=lambda n: n.id
    )
    links = [
        Link(new_id[lk.src], new_id[lk.dst], lk.bandwidth, lk.latency) for lk in topology.links
    ]
    return make_topology("permuted", nodes, links)


def test_digest_form_and_method():
    fp = fingerprint(dgx1())
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert dgx1().fingerprint() == fp == fingerprint(dgx1())


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10**6))
def test_renamed_and_reordered_inputs_keep_the_fingerprint(seed):
    for topology in (dgx_a100(2), fat_tree(4)):
        copy = shuffled_copy(topology, seed)
        assert copy.name != topology.name
        assert fingerprint(copy) == fingerprint(topology)
        assert isomorphic(copy, topology)


@settings(max_examples=20, deadline=None)
@given(st.permutations(range(20)))
def test_switch_numbering_does_not_matter(permutation):
    topology = fat_tree(4)
    assert fingerprint(permuted_switches(topology, permutation)) == fingerprint(topology)


def test_changes_change_the_fingerprint():
    base = fingerprint(dgx1())
    assert fingerprint(dgx1(bandwidth=24e9)) != base
    assert fingerprint(dgx1(latency=2e-6)) != base
    assert fingerprint(ring(8)) != fingerprint(line(8))
    assert fingerprint(dgx_a100(2)) != fingerprint(dgx_a100(3))


def test_count_and_name_are_bookkeeping():
    # One 300 GB/s port per GPU, with or without a recorded count of 12 NVLinks.
    assert fingerprint(switch(8, bandwidth=300e9)) == fingerprint(dgx_a100())


def two_triangles():
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(6)]
    links = []
    for a, b in [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)]:
        links += duplex(a, b, 25e9, 1e-6)
    return make_topology("triangles", nodes, links)


def relabelled_ranks(topology, order):
    nodes = [Node(i, n.kind, n.name, n.box) for i, n in enumerate(topology.nodes)]
    links = [Link(order[lk.src], order[lk.dst], lk.bandwidth, lk.latency) for lk in topology.links]
    return make_topology("relabelled", nodes, links)


def test_isomorphic_cases():
    permuted = relabelled_ranks(dgx1(), [3, 6, 0, 7, 1, 4, 2, 5])
    assert isomorphic(permuted, dgx1())
    assert fingerprint(permuted) != fingerprint(dgx1())  # rank ids are part of the identity
    assert isomorphic(switch(8, bandwidth=300e9), dgx_a100())
    assert not isomorphic(ring(6), two_triangles())  # same counts, different shape
    assert not isomorphic(ring(6), ring(6, bandwidth=20e9))
    assert not isomorphic(ring(6), ring(6, latency=1e-5))
    assert not isomorphic(ring(8), line(8))
    assert not isomorphic(switch(4), ring(5))  # same node count, a switch is no rank
