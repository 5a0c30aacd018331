"""Per-message checksums (``COMMFLOW_CHECKSUM=1``): a payload corrupted in transit raises
``CommProtocolError`` on the receiving rank, on shared memory and on the engine, instead of
a wrong result."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.errors import CommflowError
from commflow.runtime import CommMismatchError, CommProtocolError
from commflow.runtime.protocol import (
    HEADER,
    HEADER_BYTES,
    check_payload,
    checksum_from_env,
    make_header,
    payload_checksum,
)

from .harness import run_world
from .test_engine import place  # noqa: F401  (the fixture)

N = 1 << 12


def _flip_in_the_ring(comm):
    """Rank 1 flips one payload byte of every fragment it publishes to rank 0, after the
    checksum was computed: corruption between sender and receiver."""
    host = comm.transport.host
    if comm.rank == 1:
        publish = host.publish

        def corrupt(peer: int) -> None:
            slot = host.free_slot(peer)
            slot[HEADER_BYTES + 3] ^= 0x40
            publish(peer)

        host.publish = corrupt
    x = np.arange(N, dtype=np.float32) + comm.rank
    return comm.allreduce(x, algo="ring", timeout=10).tolist()


def test_a_payload_corrupted_in_shared_memory_raises_on_the_receiver(monkeypatch):
    monkeypatch.setenv("COMMFLOW_CHECKSUM", "1")
    results = run_world(_flip_in_the_ring, 2, timeout=30, expect_failure=True)
    ok, text = results[0]
    assert not ok and text.startswith(
        "CommProtocolError: allreduce #0 on rank 0: the message from rank 1 (shared memory; "
        "bytes 0.."), text
    assert "fails its checksum" in text and "corrupted in transit" in text, text
    assert not results[1][0]  # rank 1 is aborted by rank 0, not left waiting


def test_without_checksums_the_same_corruption_gives_a_wrong_result(monkeypatch):
    monkeypatch.setenv("COMMFLOW_CHECKSUM", "0")
    results = run_world(_flip_in_the_ring, 2, timeout=30)
    expected = (2 * np.arange(N, dtype=np.float32) + 1).tolist()
    assert results[0] != expected and results[1] != expected  # what checksums exist to catch


def _flip_on_the_wire(comm):
    """Rank 1 flips one payload byte of every engine message it sends."""
    if comm.rank == 1:
        wire = comm.transport.engine.wire
        isend = wire.isend

        def corrupt(data, peer, tag):
            if len(data) > HEADER_BYTES:
                data = data.copy()
                data[HEADER_BYTES] ^= 0x01
            return isend(data, peer, tag)

        wire.isend = corrupt
    x = np.arange(N, dtype=np.float32) + comm.rank
    return comm.allreduce(x, algo="ring", timeout=10).tolist()


def test_a_payload_corrupted_on_the_wire_raises_on_the_receiver(place):  # noqa: F811
    place([0, 1], COMMFLOW_CHECKSUM="1")
    ok, text = run_world(_flip_on_the_wire, 2, timeout=30, expect_failure=True)[0]
    assert not ok and text.startswith(
        "CommProtocolError: allreduce #0 on rank 0: the message from rank 1 (engine; bytes 0.."
    ), text
    assert "fails its checksum" in text, text


def test_checked_messages_give_exact_results_on_both_transports(place):  # noqa: F811
    place([0, 0, 1], COMMFLOW_CHECKSUM="1")
    results = run_world(_sum, 3, timeout=30)
    assert results == [(3 * np.arange(1 << 18, dtype=np.float64) + 3).tolist()] * 3


def _sum(comm):
    shm = comm.transport.shm  # None on rank 2, alone on its host
    assert comm.transport.engine.checksum and (shm is None or shm.checksum)
    x = np.arange(1 << 18, dtype=np.float64) + comm.rank
    return comm.allreduce(x, algo="ring", timeout=20).tolist()


def _header(payload: np.ndarray, checksum: int) -> np.void:
    view = np.zeros(HEADER_BYTES, np.uint8)
    make_header(view, seq=5, signature=1, comm=0, channel=0, nbytes=len(payload), offset=0,
                total=len(payload), source=1, checksum=checksum)
    return view.view(HEADER)[0]


def test_check_payload_accepts_the_sent_bytes_and_names_the_operation_otherwise():
    payload = np.arange(100, dtype=np.uint8)
    header = _header(payload, payload_checksum(payload))
    check_payload(header, payload, required=True, what="allgather #5 on rank 0", peer=1,
                  transport="engine")
    payload[7] ^= 1
    with pytest.raises(CommProtocolError, match=r"^allgather #5 on rank 0: the message from "
                       r"rank 1 \(engine; bytes 0..100 of 100\) fails its checksum"):
        check_payload(header, payload, required=False, what="allgather #5 on rank 0", peer=1,
                      transport="engine")


def test_a_rank_that_checks_refuses_messages_without_a_checksum():
    payload = np.arange(10, dtype=np.uint8)
    header = _header(payload, 0)
    check_payload(header, payload, required=False, what="x", peer=1, transport="engine")
    with pytest.raises(CommMismatchError, match="carries no checksum.*COMMFLOW_CHECKSUM=1"):
        check_payload(header, payload, required=True, what="x", peer=1, transport="engine")


def test_checksum_setting_from_the_environment():
    assert checksum_from_env({}) is False
    assert checksum_from_env({"COMMFLOW_CHECKSUM": "1"}) is True
    assert checksum_from_env({"COMMFLOW_CHECKSUM": "0"}) is False
    with pytest.raises(CommflowError, match="COMMFLOW_CHECKSUM='maybe'"):
        checksum_from_env({"COMMFLOW_CHECKSUM": "maybe"})
