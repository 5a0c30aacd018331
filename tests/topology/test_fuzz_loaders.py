"""Fuzzed topology documents: the JSON/YAML loaders raise only CommflowError subclasses
(never a RecursionError, TypeError, OverflowError ... from deep inside), quickly."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import CommflowError
from commflow.topology.formats.json_yaml import from_dict, parse_json, parse_yaml

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
KEYS = st.sampled_from(["name", "kind", "box", "nodes", "links", "src", "dst", "bandwidth",
                        "latency", "count", "duplex", "a", "b", "rank", "switch", "nic"])
VALUES = st.recursive(SCALARS | KEYS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(KEYS, inner, max_size=5), max_leaves=30)
NODE = st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "s"]),
                              "kind": st.sampled_from(["rank", "switch", "nic", "gpu"])},
                             optional={"box": VALUES})
LINK = st.fixed_dictionaries({"src": st.sampled_from(["a", "b", "s"]),
                              "dst": st.sampled_from(["a", "b", "s"])},
                             optional={"bandwidth": VALUES, "latency": VALUES, "count": VALUES,
                                       "duplex": VALUES})
DOCS = VALUES | st.fixed_dictionaries({"nodes": st.lists(NODE, max_size=4),
                                       "links": st.lists(LINK, max_size=4)},
                                      optional={"name": VALUES})


def _only_commflow_errors(load, *args) -> None:
    start = time.monotonic()
    try:
        load(*args)
    except CommflowError as err:
        assert str(err)
    assert time.monotonic() - start < 2.0


@settings(max_examples=150, deadline=None)
@given(DOCS)
def test_fuzzed_documents_raise_only_commflow_errors(doc):
    _only_commflow_errors(from_dict, doc)
    text = json.dumps(doc)
    _only_commflow_errors(parse_json, text)
    _only_commflow_errors(parse_yaml, text)  # JSON is YAML


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_fuzzed_text_raises_only_commflow_errors(text):
    _only_commflow_errors(parse_json, text)
    _only_commflow_errors(parse_yaml, text)


def test_deep_nesting_is_a_clear_error():
    deep = "[" * 100_000 + "]" * 100_000
    _only_commflow_errors(parse_json, deep)
    _only_commflow_errors(parse_yaml, "- " * 5000 + "x")
