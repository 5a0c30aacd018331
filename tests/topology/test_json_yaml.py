"""commflow JSON/YAML schema: round trips, units, rank numbering and located errors."""

from __future__ import annotations

import json

import pytest

from commflow.errors import TopologyError
from commflow.topology import (
    NodeKind,
    dgx1,
    dgx_h100,
    dump,
    fat_tree,
    fingerprint,
    isomorphic,
    load,
    mi250,
    ndv2,
    save,
    torus,
)
from commflow.topology.formats.json_yaml import from_dict, parse_json, parse_yaml


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
@pytest.mark.parametrize(
    "topology", [dgx1(), ndv2(3), dgx_h100(2), mi250(2), torus((3, 4)), fat_tree(4)],
    ids=lambda t: t.name,
)  # fmt: skip
def test_save_load_round_trip(tmp_path, topology, suffix):
    path = save(topology, tmp_path / f"topo{suffix}")
    loaded = load(path)
    assert loaded.name == topology.name
    assert fingerprint(loaded) == fingerprint(topology)
    assert isomorphic(loaded, topology)
    assert loaded.nodes == topology.nodes
    assert [(lk.src, lk.dst, lk.count) for lk in loaded.links] == [
        (lk.src, lk.dst, lk.count) for lk in topology.links
    ]


def test_dump_merges_duplex_pairs_only():
    data = dump(ndv2(2))
    directed = [lk for lk in data["links"] if not lk["duplex"]]
    assert {(lk["src"], lk["dst"]) for lk in directed} == {
        ("box0.gpu0", "box1.gpu1"),
        ("box1.gpu0", "box0.gpu1"),
    }
    assert len(data["links"]) == 2 * 16 + 2  # 16 NVLink pairs per box, written once each
    two = next(lk for lk in data["links"] if lk["src"] == "box0.gpu0" and lk["dst"] == "box0.gpu1")
    assert (two["bandwidth"], two["count"]) == (25e9, 2)
    json.dumps(data)  # plain JSON types only


HAND_WRITTEN = """
name: handmade
nodes:
  - {name: sw, kind: switch}
  - {name: b, kind: rank, box: 1}
  - {name: nic, kind: nic, box: 0}
  - {name: a, kind: rank, box: 0}
links:
  - {src: a, dst: nic, bandwidth: 25GB/s, latency: 2us}
  - {src: nic, dst: sw, bandwidth: 100gbit, count: 2}
  - {src: b, dst: sw, bandwidth: "25", duplex: false}
  - {src: sw, dst: b, bandwidth: 5.0e9, latency: 0, duplex: false}
  - {src: sw, dst: a, bandwidth: 25e9, duplex: false}
"""


def test_hand_written_yaml():
    topo = parse_yaml(HAND_WRITTEN)
    assert topo.name == "handmade"
    assert [(n.name, n.kind, n.box) for n in topo.nodes] == [
        ("b", NodeKind.RANK, 1),  # ranks first, in the file order of the rank entries
        ("a", NodeKind.RANK, 0),
        ("sw", NodeKind.SWITCH, None),
        ("nic", NodeKind.NIC, 0),
    ]
    b, a, sw, nic = range(4)
    assert topo.link(a, nic).bandwidth == topo.link(nic, a).bandwidth == 25e9
    assert topo.link(a, nic).latency == pytest.approx(2e-6)
    assert topo.link(nic, sw).bandwidth == 2 * 12.5e9 and topo.link(nic, sw).count == 2
    assert topo.link(nic, sw).latency == 1e-6  # the documented default
    assert topo.link(b, sw).bandwidth == 25e9 and topo.link(sw, b).bandwidth == 5e9
    assert topo.link(sw, a).bandwidth == 25e9
    assert len(topo.links) == 7


def test_name_defaults():
    text = '{"nodes": [{"name": "x", "kind": "rank"}], "links": []}'
    assert parse_json(text, name="from-file").name == "from-file"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a mapping"),
        ({"nodes": {}, "links": []}, "'nodes' must be a list"),
        ({"nodes": [{"name": "a", "kind": "gpu"}], "links": []}, r"nodes\[0\] \(a\): 'kind'"),
        ({"nodes": [{"name": "a", "kind": "rank", "box": "0"}], "links": []}, "'box'"),
        ({"nodes": [{"kind": "rank"}], "links": []}, r"nodes\[0\]: 'name'"),
        ({"nodes": [{"name": "a", "kind": "rank"}] * 2, "links": []}, "duplicate node name 'a'"),
        ({"nodes": [{"name": "a", "kind": "rank", "bx": 0}], "links": []}, r"unknown key.*bx"),
        ({"nodes": [{"name": "a", "kind": "rank"}], "links": [{"src": "a", "dst": "q"}]},
         r"links\[0\]: 'dst' 'q' is not a node name"),
    ],
)  # fmt: skip
def test_schema_errors_name_the_element(data, message):
    with pytest.raises(TopologyError, match=message):
        from_dict(data, source="t.json")


NODES = [{"name": "a", "kind": "rank"}, {"name": "b", "kind": "rank"}]


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ({}, "missing 'bandwidth'"),
        ({"bandwidth": "fast"}, "cannot parse bandwidth 'fast'"),
        ({"bandwidth": 0}, "bandwidth > 0"),
        ({"bandwidth": True}, "must be a number"),
        ({"bandwidth": 1e9, "latency": "soon"}, "cannot parse time"),
        ({"bandwidth": 1e9, "count": 0}, "'count' must be an integer >= 1"),
        ({"bandwidth": 1e9, "duplex": "yes"}, "'duplex' must be true or false"),
        ({"bandwidth": float("inf")}, "bandwidth must be finite"),
        ({"bandwidth": 10**400}, "bandwidth must be finite"),
        ({"bandwidth": 1e9, "latency": float("nan")}, "latency must be finite"),
        ({"bandwidth": 1e9, "latency": -float("inf")}, "latency must be finite"),
    ],
)
def test_link_errors_name_the_link(link, message):
    data = {"nodes": NODES, "links": [{"src": "a", "dst": "b", **link}]}
    with pytest.raises(TopologyError, match=rf"t.json: links\[0\] \(a -> b\): .*{message}"):
        from_dict(data, source="t.json")


def test_self_loop_is_rejected():
    data = {"nodes": NODES, "links": [{"src": "a", "dst": "a", "bandwidth": 1}]}
    with pytest.raises(TopologyError, match="two different nodes"):
        from_dict(data)


def test_syntax_errors_name_the_line(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{\n  "nodes": [\n    {"name": "a",, }\n  ]\n}\n')
    with pytest.raises(TopologyError, match=r"bad.json: line 3, column \d+: invalid JSON"):
        load(bad_json)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("nodes:\n  - name: a\n    kind: [rank\nlinks: []\n")
    with pytest.raises(TopologyError, match=r"bad.yaml: line \d+: invalid YAML"):
        load(bad_yaml)


def test_save_refuses_duplicate_names(tmp_path):
    from commflow.topology import Node, make_topology

    topo = make_topology("dup", [Node(0, NodeKind.RANK, "x"), Node(1, NodeKind.RANK, "x")], [])
    with pytest.raises(TopologyError, match="unique"):
        save(topo, tmp_path / "dup.json")
    with pytest.raises(TopologyError, match="cannot write"):
        save(dgx1(), tmp_path / "missing-dir" / "x.json")
