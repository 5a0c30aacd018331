"""Heterogeneous clusters: per-box accelerators and links from the topology, the slowest link
on a pipeline send's actual path, and HetPipe/AMP-style stages sized to their devices."""

from __future__ import annotations

import json

import pytest

from commflow.errors import CommflowError, TopologyError
from commflow.plan import MODELS, Plan, SearchSpace, evaluate, memory_per_gpu, search
from commflow.plan.comm import cluster_links, p2p_time
from commflow.plan.hardware import get_accelerator
from commflow.plan.hetero import partition_layers, stage_devices
from commflow.topology import dump, load, routes, save
from commflow.topology.formats.json_yaml import from_dict

GPT = MODELS["gpt3-6.7b"]  # 32 layers
MIXED = "dgx-a100+dgx-h100"  # box 0: 8 A100 (25 GB/s NICs), box 1: 8 H100 (50 GB/s NICs)
BASE = dict(tp=8, pp=2, dp=1, mb=1, global_batch=32, sp=True, recompute="selective")


def test_mixed_preset_labels_boxes_and_the_path_between_them_runs_at_the_slower_nic():
    topology = load(MIXED)
    assert topology.name == "dgx-a100x1+dgx-h100x1" and topology.nboxes == 2
    assert {topology.nodes[r].accelerator for r in range(8)} == {"a100-80gb"}
    assert {topology.nodes[r].accelerator for r in range(8, 16)} == {"h100-sxm"}
    [path] = routes(topology, 0, 8)
    assert min(topology.links[i].bandwidth for i in path) == 25e9
    links = cluster_links(topology)
    assert links.heterogeneous and links.network_bandwidth == 25e9
    assert [(b.accelerator, b.intra_bandwidth, b.network_bandwidth) for b in links.boxes] == [
        ("a100-80gb", 300e9, 25e9), ("h100-sxm", 450e9, 50e9)]
    assert not cluster_links(load("dgx-a100x2")).heterogeneous
    assert load("dgx-h100x2+dgx-a100").nranks == 24
    with pytest.raises(TopologyError, match="unknown topology 'dgx-a100\\+mi250'"):
        load("dgx-a100+mi250")


def test_topology_files_carry_accelerators_and_round_trip():
    data = dump(load(MIXED))
    assert data["nodes"][8]["accelerator"] == "h100-sxm" and "accelerator" not in data["nodes"][16]
    again = from_dict(json.loads(json.dumps(data)))
    assert [n.accelerator for n in again.nodes] == [n.accelerator for n in load(MIXED).nodes]
    bad = {"nodes": [{"name": "sw", "kind": "switch", "accelerator": "h100-sxm"},
                     {"name": "g", "kind": "rank"}], "links": []}  # fmt: skip
    with pytest.raises(TopologyError, match=r"'accelerator' must be a non-empty string on a rank"):
        from_dict(bad)
    data["nodes"][1]["accelerator"] = "h100-sxm"  # box 0 now mixes two kinds
    with pytest.raises(CommflowError, match="box 0 mixes accelerators"):
        cluster_links(from_dict(data))


def test_each_stage_runs_on_its_box_and_a_send_crosses_the_slower_nic():
    plan = Plan(**BASE)
    links = cluster_links(load(MIXED))
    devices = stage_devices(links, plan, get_accelerator("a100-80gb"))
    assert [d.accelerator.name for d in devices] == ["a100-80gb", "h100-sxm"]
    assert [d.links.intra_bandwidth for d in devices] == [300e9, 450e9]
    result = evaluate(GPT, MIXED, plan)
    act = 2048 * 4096 * 2 / 8  # one micro-batch's 16-bit activations, split by SP
    assert result.p2p == pytest.approx(2 * 5e-6 + act / 25e9)  # slowest link: the A100's NIC
    assert result.p2p == p2p_time(act, 8, links)
    assert result.stage_accelerators == ("a100-80gb", "h100-sxm")


def test_partition_layers_minimizes_the_slowest_stage_within_memory():
    assert partition_layers(30, (2.0, 1.0), (0.0, 0.0), (99, 99)) == (10, 20)
    assert partition_layers(30, (2.0, 1.0), (0.0, 0.0), (99, 15)) == (15, 15)  # memory caps
    assert partition_layers(32, (1.0,) * 4, (0.0, 0.0, 0.0, 4.0), (99,) * 4) == (9, 9, 9, 5)
    with pytest.raises(CommflowError, match="cannot split 30 layers over 2 stages"):
        partition_layers(30, (1.0, 1.0), (0.0, 0.0), (10, 10))


def test_h100_stage_gets_more_layers_and_the_step_beats_the_even_split():
    even = evaluate(GPT, MIXED, Plan(**BASE))
    balanced = evaluate(GPT, MIXED, Plan(**BASE, partition="balanced"))
    assert even.stage_layers == (16.0, 16.0)
    assert balanced.stage_layers == (12.0, 20.0)  # the H100 stage takes the larger share
    assert balanced.step_time < 0.85 * even.step_time  # 1.32 s vs 1.65 s
    busy = balanced.pipeline.stage_busy
    assert max(busy) / min(busy) < 1.15 < max(even.pipeline.stage_busy) / min(
        even.pipeline.stage_busy)
    # memory: the fuller stage, the H100's 20 layers in its 80 GB
    assert balanced.memory == memory_per_gpu(GPT, Plan(**BASE, partition="balanced"), layers=20)
    # a homogeneous cluster keeps the even split's stages (the logits weigh one layer here)
    same = evaluate(GPT, "dgx-a100x2", Plan(**BASE, partition="balanced"))
    assert same.step_time <= evaluate(GPT, "dgx-a100x2", Plan(**BASE)).step_time


def test_balanced_plan_constraints():
    with pytest.raises(CommflowError, match="partition=balanced needs vp=1"):
        Plan(**BASE, partition="balanced", vp=2, schedule="interleaved")
    with pytest.raises(CommflowError, match="partition must be one of even, balanced"):
        Plan(**BASE, partition="uneven")


def test_search_on_a_mixed_cluster_tries_balanced_partitions():
    space = SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("selective",),
                        zero=(1,))  # fmt: skip
    results = search(GPT, MIXED, global_batch=32, top=3, space=space)
    assert all(r.fits for r in results)
    assert results[0].plan.partition == "balanced" and results[0].plan.pp > 1
    assert results[0].stage_layers[0] < results[0].stage_layers[-1]
    again = evaluate(GPT, MIXED, results[0].plan)
    assert again.step_time == pytest.approx(results[0].step_time)


def test_a_saved_topology_file_keeps_its_accelerators_for_the_planner(tmp_path):
    path = save(load(MIXED), tmp_path / "mixed.yaml")
    plan = Plan(**BASE, partition="balanced")
    from_file, preset = evaluate(GPT, str(path), plan), evaluate(GPT, MIXED, plan)
    assert from_file.stage_accelerators == ("a100-80gb", "h100-sxm")
    assert from_file.step_time == preset.step_time
