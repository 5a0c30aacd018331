"""Offline tuning: the table's rule at every tuned size is the fastest registered algorithm
there (checked by simulating each one here), ranges tile all sizes, and the CLI writes it."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow import topology
from commflow.algorithms import available, build_for
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.sim import simulate
from commflow.tune import offline_table, rank, registered
from commflow.tuning_table import Rule, TuningTable, from_json, load_table
from commflow.units import size_range

SIZES = size_range(1 << 10, 1 << 30, 8)
TOP = 2**63 - 1


def fastest(collective, topo, size):
    times = {}
    for algorithm in available(collective):
        try:
            program = build_for(collective, algorithm.name, topo)
        except AlgorithmError:
            continue
        times[algorithm.name] = simulate(program, topo, size).time
    return min(times, key=times.get), times


@pytest.mark.parametrize("name", ["dgx1", "ring4", "dgx-a100x2"])
def test_every_tuned_size_gets_the_fastest_registered_algorithm(name):
    topo = topology.load(name)
    table = offline_table(["allreduce", "allgather"], topo, SIZES)
    for collective in ("allreduce", "allgather"):
        rules = [r for r in table.rules if r.collective.value == collective]
        assert rules[0].min_bytes == 0 and rules[-1].max_bytes == 2**63 - 1
        assert all(b.min_bytes == a.max_bytes + 1
                   for a, b in zip(rules, rules[1:], strict=False))
        for size in SIZES:
            best, times = fastest(collective, topo, size)
            chosen = table.lookup(collective, topo.nranks, size)
            assert times[chosen] == times[best]  # ties may name another algorithm
    assert table.lookup("allreduce", topo.nranks + 1, 1024) is None
    assert from_json(table.to_json()) == table


def test_rank_orders_by_time_and_registered_places_on_the_topology():
    topo = topology.dgx1()
    ranked = rank(registered("allreduce", topo), topo, 1 << 20)
    assert [r.seconds for r in ranked] == sorted(r.seconds for r in ranked)
    assert {r.method for r in ranked} >= {"ring", "double_binary_tree", "direct"}


NCCL_COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
NCCL_ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")


def nccl_plugin_rules(text):
    """The rules NCCL's example tuner plugin (plugins/tuner/example/plugin.c) loads from a
    config: lines that are neither empty nor start with '#', 8-10 comma-separated fields;
    a name it does not know silently becomes its default (allreduce, ring, simple), so every
    name must be one it knows, and every number a whole integer."""
    rules = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        assert 8 <= len(fields) <= 10, line
        coll, low, high, algo, proto, *numbers = fields
        assert coll in NCCL_COLLECTIVES and algo in NCCL_ALGORITHMS, line
        assert proto in ("ll", "ll128", "simple"), line
        assert all(n.lstrip("-").isdigit() for n in (low, high, *numbers)), line
        assert 0 <= int(low) <= int(high) < 2**64, line
        rules.append((coll, int(low), int(high), algo, proto, *map(int, numbers)))
    return rules


def test_nccl_csv_keeps_the_algorithms_nccl_has():
    rules = [Rule(collective=coll, nranks=8, min_bytes=low, max_bytes=high, algo=algo,
                  time_us=1.0) for coll, low, high, algo in (
        (Collective.ALLGATHER, 0, 99, "ring"), (Collective.ALLGATHER, 100, TOP, "multi_ring"),
        (Collective.ALLREDUCE, 0, 99, "double_binary_tree"),
        (Collective.ALLREDUCE, 100, 999, "halving_doubling"),
        (Collective.ALLREDUCE, 1000, TOP, "multi_ring"),
        (Collective.BROADCAST, 0, TOP, "double_binary_tree"))]
    table = TuningTable(fingerprint="f", topology="t", model="flow", rules=tuple(rules))
    text = table.to_nccl_csv()
    assert text.splitlines()[0].startswith("# collective_type,min_bytes,max_bytes,algorithm")
    assert nccl_plugin_rules(text) == [
        ("allgather", 0, 99, "ring", "simple", -1, -1, 8),
        ("allgather", 100, TOP, "ring", "simple", -1, -1, 8),
        ("allreduce", 0, 99, "tree", "simple", -1, -1, 8),  # NCCL's tree: allreduce only
        ("allreduce", 1000, TOP, "ring", "simple", -1, -1, 8)]
    assert nccl_plugin_rules(table.to_nccl_csv(nnodes=2, protocol="ll128", channels=16))[0] \
        == ("allgather", 0, 99, "ring", "ll128", 16, 2, 8)
    for bad in ({"protocol": "-1"}, {"protocol": "LL"}, {"channels": 0}):
        with pytest.raises(CommflowError, match="NCCL tuner rules"):
            table.to_nccl_csv(**bad)


def test_nccl_csv_of_a_tuned_table_loads_in_the_plugin():
    table = offline_table(["allreduce", "allgather"], topology.load("dgx-a100x4"), SIZES)
    nccl = [r for r in table.rules if r.algo in ("ring", "multi_ring")]
    assert nccl and [r[1:3] for r in nccl_plugin_rules(table.to_nccl_csv())] == [
        (r.min_bytes, r.max_bytes) for r in nccl]


def test_bad_sweeps_are_refused():
    with pytest.raises(CommflowError, match="increasing sizes"):
        offline_table(["allreduce"], topology.dgx1(), [1024, 512])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=40), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12).map(json.dumps)))
def test_malformed_tables_raise_commflow_errors(text):
    with pytest.raises(CommflowError):
        from_json(text)


def test_table_fields_are_checked(tmp_path):
    good = json.loads(offline_table(["allreduce"], topology.load("ring4"), SIZES).to_json())
    for field, value, message in [("version", 3, "version 3"), ("rules", {}, "'rules'"),
                                  ("fingerprint", 3, "'fingerprint'")]:
        with pytest.raises(CommflowError, match=message):
            from_json(json.dumps({**good, field: value}))
    bad = {**good, "rules": [{**good["rules"][0], "max_bytes": -1}]}
    with pytest.raises(CommflowError, match=r"rules\[0\]: .*min_bytes <= max_bytes"):
        from_json(json.dumps(bad))
    overlapping = {**good, "rules": [good["rules"][0], good["rules"][0]]}
    with pytest.raises(CommflowError, match="overlapping"):
        from_json(json.dumps(overlapping))
    with pytest.raises(CommflowError, match="cannot read tuning table"):
        load_table(tmp_path / "missing.json")


def test_cli_writes_the_table_and_csv(tmp_path):
    from commflow.cli import main

    path, csv = tmp_path / "t.json", tmp_path / "n.csv"
    with pytest.raises(SystemExit) as done:
        main(["tune", "allreduce", "--topo", "dgx1", "-b", "1K", "-e", "1G", "-f", "8",
              "-o", str(path), "--nccl-csv", str(csv)])
    assert done.value.code in (0, None)
    table = load_table(path)
    assert table == offline_table(["allreduce"], topology.dgx1(), SIZES)
    assert csv.read_text() == table.to_nccl_csv()
