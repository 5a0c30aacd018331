"""``commflow topo``: summaries match the topology library; presets are listed."""

from __future__ import annotations

import json

from commflow.topology import diameter, fingerprint, load, presets, save


def test_show_dgx1_summary_and_link_groups(commflow):
    run = commflow("topo", "show", "dgx1")
    assert run.code == 0
    lines = [line.split() for line in run.stdout.splitlines()]
    facts = {" ".join(w[:-1]): w[-1] for w in lines[1:9]}
    assert facts["ranks"] == "8" and facts["switches"] == "0" and facts["NICs"] == "0"
    assert facts["links (directed)"] == "32"
    assert facts["out GB/s per rank"] == "150.00"  # 6 NVLinks x 25 GB/s
    assert facts["diameter (rank hops)"] == "2"
    assert facts["fingerprint"] == fingerprint(load("dgx1"))
    groups = [w for w in lines if w and w[0] in ("50.00", "25.00")]
    assert groups == [
        ["50.00", "2", "1.00", "16", "rank->rank", "x16"],
        ["25.00", "1", "1.00", "16", "rank->rank", "x16"],
    ]


def test_show_json_of_a_multi_box_preset(commflow):
    topo = load("dgx-a100x2")
    run = commflow("topo", "show", "dgx-a100x2", "--json")
    assert run.code == 0
    doc = json.loads(run.stdout)
    assert (doc["ranks"], doc["switches"], doc["nics"], doc["boxes"]) == (16, 4, 16, 2)
    assert doc["links"] == len(topo.links)
    assert doc["rank_out_bandwidth"] == [325.0] * 16  # NVSwitch port 300 + NIC 25 GB/s
    assert doc["diameter"] == diameter(topo)
    assert sum(g["links"] for g in doc["link_groups"]) == len(topo.links)
    assert doc["link_groups"][0] == {
        "bandwidth": 300.0,
        "parallel": 1,
        "latency_us": 1.0,
        "links": 32,
        "between": {"rank->switch": 16, "switch->rank": 16},
    }


def test_show_a_topology_file(commflow, tmp_path):
    path = tmp_path / "ring4.json"
    save(load("ring4"), path)
    doc = json.loads(commflow("topo", "show", str(path), "--json").stdout)
    assert doc["ranks"] == 4 and doc["fingerprint"] == fingerprint(load("ring4"))


def test_unknown_topology_is_one_error_line(commflow):
    run = commflow("topo", "show", "dgx9")
    assert run.code == 2 and run.stdout == ""
    assert run.stderr.startswith("error: unknown topology 'dgx9'")
    assert run.stderr.count("\n") == 1


def test_list_presets(commflow):
    run = commflow("topo", "list")
    assert run.stdout.splitlines() == list(presets())
    assert json.loads(commflow("topo", "list", "--json").stdout) == list(presets())
