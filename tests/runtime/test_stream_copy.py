"""The fast path's copy and sum with non-temporal stores: the same bytes as numpy at every
alignment of its ends (a head and a tail around the aligned body), and a plain copy where it
cannot stream."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.runtime._stream_kernels import stream_add, stream_copy

_SOURCE = np.random.default_rng(7).integers(0, 256, 1 << 16, dtype=np.uint8)


@settings(deadline=None)  # the first example compiles the kernel
@given(st.integers(0, 70), st.integers(0, 70), st.integers(0, 5000))
def test_streams_the_same_bytes_at_any_alignment(dst_at, src_at, nbytes):
    dst = np.zeros(6000, np.uint8)
    src = _SOURCE[src_at:src_at + nbytes]
    stream_copy(dst[dst_at:dst_at + nbytes], src)
    assert np.array_equal(dst[dst_at:dst_at + nbytes], src)
    assert not dst[:dst_at].any() and not dst[dst_at + nbytes:].any()  # nothing around


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_typed_arrays_and_the_plain_fallback(dtype):
    src = (np.arange(100_003) % 2000).astype(dtype)
    dst = np.zeros_like(src)
    stream_copy(dst, src)
    assert np.array_equal(dst, src)
    strided = np.zeros(2 * src.size, dtype)[::2]  # not contiguous: a plain copy
    stream_copy(strided, src)
    assert np.array_equal(strided, src)
    with pytest.raises(ValueError):  # numpy's own error for shapes that do not match
        stream_copy(dst[:10], src)
    shifted = np.arange(100, dtype=dtype)
    stream_copy(shifted[1:], shifted[:-1])  # overlapping: numpy's copy, which handles it
    assert np.array_equal(shifted[1:], np.arange(99, dtype=dtype))


def test_the_benchmark_script_prints_both_stores(capsys, monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_copy.py"
    spec = importlib.util.spec_from_file_location("stream_copy_benchmark", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["stream_copy.py", "--mib", "1", "--segment-kib", "96",
                                      "--repeats", "1"])
    module.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# 1 MiB through a 96 KiB staging segment, best of 1")
    assert [line.split()[0] for line in lines[1:4]] == ["store", "plain", "stream"]
    assert all(float(line.split()[1]) > 0 for line in lines[2:4])
    assert lines[4].startswith("# streamed / plain time: ")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_streamed_sums_match_numpy_at_any_alignment(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5000) * 1000).astype(dtype)
    y = (rng.standard_normal(5000) * 1000).astype(dtype)
    for at in range(9):  # the output's start against the 32-byte stores
        for count in (0, 1, 9, 4097):
            out = np.zeros(count + 16, dtype)
            assert stream_add(out[at:at + count], x[3:3 + count], y[:count])
            assert np.array_equal(out[at:at + count], x[3:3 + count] + y[:count])
            assert not out[:at].any() and not out[at + count:].any()


def test_streamed_sums_refuse_what_they_cannot_add():
    x = np.ones(64, np.float32)
    out = np.zeros(64, np.float32)
    assert not stream_add(x, x, out)  # the output is an input: numpy's add instead
    assert not stream_add(out.astype(np.float16), x.astype(np.float16), x.astype(np.float16))
    assert not stream_add(out[::2], x[:32], x[:32])  # not contiguous
    assert not stream_add(out[:10], x[:11], x[:11])
    assert not out.any()
