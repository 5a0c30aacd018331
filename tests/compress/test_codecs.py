import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.compress import Codec, ErrorFeedback, decode, encode, scales
from commflow.errors import CommflowError


def _x(seed, n=1024):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


@given(st.integers(0, 2**31), st.sampled_from(["int8", "int4"]), st.sampled_from([2, 16, 256]))
@settings(max_examples=40, deadline=None)
def test_int_error_is_at_most_half_a_scale(seed, name, block):
    codec = Codec(name=name, block=block)
    x = _x(seed)
    y = decode(encode(x, codec), x.size, codec)
    qmax = 127 if name == "int8" else 7
    absmax = np.abs(x.reshape(-1, block)).max(axis=1)
    ref = absmax / np.float32(qmax)
    np.testing.assert_array_equal(scales(x, codec), ref)
    # half a scale, plus float32's rounding of x / s and of q * s: each at most half an ulp
    # of a value up to the block's absmax (x / s = 56.5 exactly, seed 25417, int8, block 16:
    # a tie rounded to even, then q * s rounded up, 0.50000143 s from x)
    bound = np.repeat(ref / 2 + np.spacing(absmax), block)
    assert np.all(np.abs(y - x) <= bound)


def test_sizes_and_float_casts():
    x = _x(1)
    assert encode(x, Codec(name="int8")).size == 4 * (4 + 256)
    assert encode(x, Codec(name="int4")).size == 4 * (4 + 128)
    np.testing.assert_array_equal(decode(encode(x, Codec(name="fp16")), x.size, Codec(name="fp16")),
                                  x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(decode(encode(x, Codec(name="bf16")), x.size, Codec(name="bf16")),
                                  x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_int4_packs_extremes_and_zero_blocks():
    codec = Codec(name="int4", block=4)
    x = np.array([7, -7, 1, 0, 0, 0, 0, 0], np.float32)
    np.testing.assert_array_equal(decode(encode(x, codec), 8, codec), x)


def test_error_feedback_tracks_the_sum_within_one_residual():
    codec = Codec(name="int4", block=64)
    ef = ErrorFeedback()
    true_sum = np.zeros(256, np.float32)
    sent_sum = np.zeros(256, np.float32)
    for t in range(50):
        g = _x(t, 256)
        c = ef.compensate("g", g)
        sent = decode(encode(c, codec), c.size, codec)
        ef.update("g", c, sent)
        true_sum += g
        sent_sum += sent
    np.testing.assert_allclose(true_sum - sent_sum, ef.residual("g"), atol=1e-4)
    # one residual is at most half a scale of the last compensated value
    assert np.abs(ef.residual("g")).max() <= np.abs(c).max() / 7 / 2 * (1 + 1e-6)


def test_rejections():
    with pytest.raises(CommflowError, match="unknown"):
        Codec(name="int2")
    with pytest.raises(CommflowError, match="even"):
        Codec(block=3)
    with pytest.raises(CommflowError, match="multiple of block"):
        encode(np.zeros(10, np.float32), Codec(block=4))
    with pytest.raises(CommflowError, match="expected"):
        decode(np.zeros(5, np.uint8), 4, Codec(block=4))


def _numpy_encode(x, codec):
    """The wire format stated in numpy: float32 scale, then rint(x / scale) per block."""
    qmax = {"int8": 127, "int4": 7}[codec.name]
    blocks = x.reshape(-1, codec.block)
    s = (np.abs(blocks).max(axis=1) / np.float32(qmax)).astype(np.float32)
    q = np.rint(blocks / np.where(s > 0, s, np.float32(1))[:, None]).astype(np.int8)
    if codec.name == "int4":
        u = (q + 8).astype(np.uint8)
        q = (u[:, 0::2] | (u[:, 1::2] << 4)).view(np.int8)
    return np.concatenate([s.view(np.uint8).reshape(-1, 4), q.view(np.uint8)], axis=1).ravel()


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("block", [2, 64, 256])
def test_compiled_kernels_write_the_stated_format(name, block):
    rng = np.random.default_rng(block)
    x = (rng.standard_normal(block * 37) * rng.choice([1e-3, 1.0, 1e3], block * 37)).astype(
        np.float32)
    x[:block] = 0  # an all-zero block
    codec = Codec(name=name, block=block)
    wire = encode(x, codec)
    np.testing.assert_array_equal(wire, _numpy_encode(x, codec))
    total = np.ones(x.size, np.float32)
    decode(wire, x.size, codec, add_to=total)
    np.testing.assert_array_equal(total, np.float32(1) + decode(wire, x.size, codec))
