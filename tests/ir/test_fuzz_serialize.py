"""Fuzzed program JSON: ``from_json`` raises only ``ProgramError`` (a CommflowError), quickly,
whatever field of a valid document is replaced and however the text is damaged."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import CommflowError
from commflow.ir import from_json, to_json

from .programs import ring_allreduce, two_channel_allgather

DOCS = [json.loads(to_json(p)) for p in (ring_allreduce(3), two_channel_allgather(2))]
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=10,
) | st.integers(min_value=2**62) | st.just(-1)


def _paths(node, prefix=()):
    """Every path (keys and indices) into a JSON value, itself included."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


PATHS = [list(_paths(doc)) for doc in DOCS]


def _replace(doc, path, value):
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


def _only_commflow_errors(text: str) -> None:
    start = time.monotonic()
    try:
        from_json(text)
    except CommflowError as err:
        assert str(err)
    assert time.monotonic() - start < 2.0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzzed_fields_raise_only_program_errors(data):
    which = data.draw(st.integers(0, len(DOCS) - 1))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(PATHS[which]))
        doc = _replace(DOCS[which], path, data.draw(VALUES))
        _only_commflow_errors(json.dumps(doc))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2000), st.text(max_size=5))
def test_damaged_text_raises_only_program_errors(cut, junk):
    text = to_json(ring_allreduce(3))
    _only_commflow_errors(text[:cut] + junk + text[cut + len(junk):])


def test_deep_nesting_is_a_program_error():
    _only_commflow_errors("[" * 100_000 + "]" * 100_000)
