"""Point-to-point messages: batches in any order and of any size complete, tags match like
gloo's, messages to oneself, sub-groups, and a clear error for mismatched tensors."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from .harness import run_group

BIG = 3 << 20
"""float32 elements per big message: 12 MiB, more than a shared-memory ring holds (8 MiB)."""


def _messages() -> dict[str, object]:
    r, n = dist.get_rank(), dist.get_world_size()
    nxt, prv = (r + 1) % n, (r - 1) % n
    out: dict[str, object] = {}

    # A ring with the receive first and messages larger than a ring buffer: issued in this
    # order by every rank, it would deadlock without the backend's ordering.
    got = torch.empty(BIG)
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.full((BIG,), r + 0.5), nxt)]
    )
    for work in works:
        work.wait()
    out["ring"] = (float(got[0]), float(got[-1]))

    # Both neighbours send first, then receive (a head-on exchange), large messages too.
    got_l, got_r = torch.empty(BIG), torch.empty(BIG)
    works = [
        dist.isend(torch.full((BIG,), 10.0 * r), nxt),
        dist.isend(torch.full((BIG,), 10.0 * r + 1), prv),
        dist.irecv(got_l, prv),
        dist.irecv(got_r, nxt),
    ]
    while not all(w.is_completed() for w in works):  # polling alone starts the batch
        time.sleep(0.001)
    out["exchange"] = (float(got_l[0]), float(got_r[-1]))

    # Tags: rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first (blocking calls).
    if r == 0:
        dist.send(torch.tensor([1.0]), 1, tag=1)
        dist.send(torch.tensor([2.0, 2.0]), 1, tag=2)
    elif r == 1:
        two, one = torch.empty(2), torch.empty(1)
        dist.recv(two, 0, tag=2)
        dist.recv(one, 0, tag=1)
        out["tags"] = (one.tolist(), two.tolist())

    # A message to oneself, and int64 / bfloat16 payloads.
    mine = torch.empty(3, dtype=torch.int64)
    works = [dist.isend(torch.arange(3) + r, r), dist.irecv(mine, r)]
    for work in works:
        work.wait()
    out["self"] = mine.tolist()
    half = torch.empty(4, dtype=torch.bfloat16)
    works = [
        dist.isend(torch.full((4,), r + 0.5, dtype=torch.bfloat16), nxt),
        dist.irecv(half, prv),
    ]
    for work in works:
        work.wait()
    out["bfloat16"] = half.float().tolist()

    # Ranks of a sub-group are group ranks.
    sub = dist.new_group([0, n - 1])
    if r in (0, n - 1):
        peer = 1 - dist.get_rank(sub)
        got = torch.empty(2)
        works = [
            dist.irecv(got, group=sub, group_src=peer),
            dist.isend(torch.full((2,), float(r)), group=sub, group_dst=peer),
        ]
        for work in works:
            work.wait()
        out["subgroup"] = got.tolist()

    # A receive whose tensor does not match the message fails with both sizes named.
    if r == 0:
        dist.send(torch.ones(4), 1, tag=7)
    elif r == 1:
        try:
            dist.recv(torch.empty(3), 0, tag=7)
        except Exception as err:
            out["mismatch"] = f"{type(err).__name__}: {err}"
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_group(_messages, 3)


def test_receive_first_ring_of_large_messages_completes(results):
    for r, res in enumerate(results):
        assert res["ring"] == ((r - 1) % 3 + 0.5, (r - 1) % 3 + 0.5)


def test_head_on_exchange_of_large_messages_completes(results):
    for r, res in enumerate(results):
        assert res["exchange"] == (10.0 * ((r - 1) % 3), 10.0 * ((r + 1) % 3) + 1)


def test_tags_match_out_of_order(results):
    assert results[1]["tags"] == ([1.0], [2.0, 2.0])


def test_messages_to_oneself_and_other_dtypes(results):
    for r, res in enumerate(results):
        assert res["self"] == [r, r + 1, r + 2]
        assert res["bfloat16"] == [(r - 1) % 3 + 0.5] * 4


def test_subgroup_peers_are_group_ranks(results):
    assert results[0]["subgroup"] == [2.0, 2.0]
    assert results[2]["subgroup"] == [0.0, 0.0]
    assert "subgroup" not in results[1]


def test_mismatched_receive_names_both_sizes(results):
    assert results[1]["mismatch"].startswith("CommMismatchError: commflow recv from rank 0")
    assert "carries 16 bytes" in results[1]["mismatch"]
    assert "expects 12 bytes of torch.float32" in results[1]["mismatch"]
