"""Codecs from Python: round-trip bounds, error feedback, validation, and
clear errors for arrays the codecs cannot use."""

import builtins

import numpy as np
import pytest

import fedwan


def values(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 0.3).astype(np.float32)


def test_codec_names_and_sizes():
    names = fedwan.codec_names()
    assert {"fp32", "fp16", "bf16", "int8"} <= set(names)
    assert fedwan.encoded_size("fp32", 10) == 40
    # int8: one fp32 scale per block of 256, then one byte per value.
    assert fedwan.encoded_size("int8", 0) == 0
    assert fedwan.encoded_size("int8", 256) == 4 + 256
    assert fedwan.encoded_size("int8", 257) == 8 + 257
    for name in names:
        assert len(fedwan.encode(name, values(100))) == fedwan.encoded_size(name, 100)


def test_fp32_round_trip_is_exact_and_flattens_any_shape():
    x = values(60).reshape(3, 4, 5)
    data = fedwan.encode("fp32", x)
    assert isinstance(data, bytes)
    out = fedwan.decode("fp32", data, x.size)
    assert out.dtype == np.float32 and out.shape == (60,)
    assert np.array_equal(out, x.reshape(-1))


def test_non_contiguous_float32_input_is_encoded_by_value():
    x = values(200)
    strided = x[::2]
    assert not strided.flags.c_contiguous
    out = fedwan.decode("fp32", fedwan.encode("fp32", strided), strided.size)
    assert np.array_equal(out, strided)


@pytest.mark.parametrize("name,unit_roundoff", [("fp16", 2.0 ** -11), ("bf16", 2.0 ** -8)])
def test_lossy_round_trip_within_half_a_unit_in_the_last_place(name, unit_roundoff):
    x = values()
    out = fedwan.decode(name, fedwan.encode(name, x), x.size)
    err = np.abs(out.astype(np.float64) - x.astype(np.float64))
    # Round to nearest: relative error <= unit roundoff, plus a floor far
    # below any value of x for the smallest magnitudes.
    bound = unit_roundoff * np.abs(x.astype(np.float64)) + np.abs(x).max() * 2.0 ** -30
    assert np.all(err <= bound), float((err - bound).max())
    assert not np.array_equal(out, x), "a lossy codec that loses nothing is suspicious"


def int8_scales(data, n):
    return np.frombuffer(data, "<f4", count=-(-n // 256))


def test_int8_round_trip_within_half_a_step_of_each_block():
    # Blocks of very different magnitudes: each keeps its own step.
    x = values(3 * 256 + 40)
    x[256:512] *= 1e-4
    x[512:768] *= 1e3
    data = fedwan.encode("int8", x)
    n = x.size
    scales = int8_scales(data, n)
    assert scales.size == 4
    block_max = np.array([np.abs(x[k:k + 256]).max() for k in range(0, n, 256)])
    np.testing.assert_array_equal(scales, (block_max / np.float32(127)).astype(np.float32))
    q = np.frombuffer(data, np.int8, offset=4 * scales.size)
    assert q.min() >= -127 and q.max() <= 127
    out = fedwan.decode("int8", data, n)
    np.testing.assert_array_equal(out, q.astype(np.float32) * np.repeat(scales, 256)[:n])
    err = np.abs(out.astype(np.float64) - x.astype(np.float64))
    bound = np.repeat(scales.astype(np.float64), 256)[:n] * 0.5 * (1 + 2.0 ** -12)
    assert np.all(err <= bound), float((err - bound).max())


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8"])
def test_error_feedback_keeps_the_decoded_sum_on_track(name):
    x = values(2048, seed=1)
    rounds = 64
    residual = np.zeros_like(x)
    with_feedback = np.zeros(x.size, np.float64)
    without = np.zeros(x.size, np.float64)
    for _ in range(rounds):
        with_feedback += fedwan.decode(name, fedwan.encode(name, x, residual), x.size)
        without += fedwan.decode(name, fedwan.encode(name, x), x.size)
    truth = rounds * x.astype(np.float64)
    err_fb = np.abs(with_feedback - truth).max()
    err_plain = np.abs(without - truth).max()
    # With feedback the error stays about one quantisation step (what the
    # residual holds); without it, the rounding bias adds up every round.
    step = np.abs(x).max() * {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7, "int8": 1 / 127}[name]
    assert err_fb <= step, (err_fb, step)
    assert err_fb * 8 < err_plain
    # The residual holds what is still owed: decoded sum + residual == truth.
    np.testing.assert_allclose(with_feedback + residual, truth, rtol=0, atol=1e-4)


def test_fp32_with_residual_sends_it_and_clears_it():
    x = values(100)
    residual = np.full_like(x, 0.5)
    out = fedwan.decode("fp32", fedwan.encode("fp32", x, residual), x.size)
    np.testing.assert_array_equal(out, x + np.float32(0.5))
    assert not residual.any()


def test_validate_and_decode_reject_malformed_payloads():
    x = values(64)
    good = fedwan.encode("fp16", x)
    assert fedwan.validate("fp16", good, 64)
    assert fedwan.validate("fp16", bytearray(good), 64)
    assert fedwan.validate("fp16", memoryview(good), 64)
    assert not fedwan.validate("fp16", good[:-1], 64)
    assert not fedwan.validate("fp16", good, 63)
    bad = bytearray(good)
    bad[-2:] = (0x7C00).to_bytes(2, "little")  # the last half becomes +inf
    assert not fedwan.validate("fp16", bytes(bad), 64)
    with pytest.raises(fedwan.ProtocolError, match="not a valid fp16 encoding of 64 values"):
        fedwan.decode("fp16", bytes(bad), 64)
    nan32 = np.array([1.0, np.nan], np.float32).tobytes()
    assert not fedwan.validate("fp32", nan32, 2)


def test_int8_validate_rejects_minus_128_and_bad_scales():
    good = fedwan.encode("int8", values(300))
    assert fedwan.validate("int8", good, 300)
    assert not fedwan.validate("int8", good[:-1], 300)
    minus_128 = bytearray(good)
    minus_128[8 + 299] = 0x80  # never produced: the range is symmetric
    assert not fedwan.validate("int8", bytes(minus_128), 300)
    for scale in (-1.0, -0.0, np.inf, np.nan, 2.0 ** 122):  # 127 * 2^122 overflows
        bad = bytearray(good)
        bad[4:8] = np.float32(scale).tobytes()
        assert not fedwan.validate("int8", bytes(bad), 300), scale
    with pytest.raises(fedwan.ProtocolError, match="not a valid int8 encoding of 300 values"):
        fedwan.decode("int8", bytes(minus_128), 300)


def test_non_finite_input_raises_and_leaves_the_residual_alone():
    x = values(32)
    x[7] = np.inf
    residual = np.full_like(x, 0.25)
    for name in ("fp16", "int8"):
        with pytest.raises(fedwan.Error, match=f"codec {name}: cannot encode a non-finite"):
            fedwan.encode(name, x, residual)
        assert np.all(residual == np.float32(0.25))


def test_bad_arguments_raise_config_error_with_the_fix():
    x = values(16)
    with pytest.raises(fedwan.ConfigError, match="known codecs: fp32, fp16, bf16, int8"):
        fedwan.encode("int3", x)
    with pytest.raises(fedwan.ConfigError, match="dtype float32, not float64"):
        fedwan.encode("fp16", x.astype(np.float64))
    with pytest.raises(fedwan.ConfigError, match="numpy.ndarray"):
        fedwan.encode("fp16", [1.0, 2.0])
    with pytest.raises(fedwan.ConfigError, match="residual has 8 elements, values 16"):
        fedwan.encode("fp16", x, np.zeros(8, np.float32))
    with pytest.raises(fedwan.ConfigError, match="residual must have dtype float32"):
        fedwan.encode("fp16", x, np.zeros(16, np.float64))
    with pytest.raises(fedwan.ConfigError, match="C-contiguous"):
        fedwan.encode("fp16", x, np.zeros(32, np.float32)[::2])
    frozen = np.zeros(16, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(fedwan.ConfigError, match="read-only"):
        fedwan.encode("fp16", x, frozen)
    with pytest.raises(fedwan.ConfigError, match="bytes-like"):
        fedwan.decode("fp32", "not bytes", 1)


def test_error_hierarchy():
    for cls in (fedwan.ConfigError, fedwan.ProtocolError, fedwan.CryptoError,
                fedwan.TransportError, fedwan.TimeoutError):
        assert issubclass(cls, fedwan.Error)
    assert issubclass(fedwan.Error, RuntimeError)
    assert issubclass(fedwan.TimeoutError, builtins.TimeoutError)
    assert fedwan.Error.__module__ == "fedwan"
