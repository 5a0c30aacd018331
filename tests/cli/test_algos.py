"""``commflow algos``: the registry, as a table and as JSON."""

from __future__ import annotations

import json

from commflow.algorithms import available


def test_table_lists_every_registered_algorithm(commflow):
    run = commflow("algos")
    assert run.code == 0
    keys = [line.split()[0] for line in run.stdout.splitlines()[1:] if line[:1].strip()]
    assert keys == [a.key for a in available(in_network=True)]
    assert "allreduce/ina" in keys


def test_json_for_one_collective(commflow):
    records = json.loads(commflow("algos", "allreduce", "--json").stdout)
    want = available("allreduce", in_network=True)
    assert [r["key"] for r in records] == [a.key for a in want]
    for record, algo in zip(records, want, strict=True):
        assert record["summary"] == algo.summary
        assert record["in_network"] == (algo.name == "ina")
        assert record["params"] == ["chunks", "channels", *algo.params]


def test_rooted_collectives_take_a_root(commflow):
    records = json.loads(commflow("algos", "broadcast", "--json").stdout)
    assert records and all(r["params"][:3] == ["chunks", "channels", "root"] for r in records)


def test_unknown_collective(commflow):
    run = commflow("algos", "allsum")
    assert run.code == 2 and "error: unknown collective 'allsum'" in run.stderr
