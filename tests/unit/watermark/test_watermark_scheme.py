"""Keys, keystreams, carrier plans, code words, the binomial tail and the embedding rule."""

from __future__ import annotations

import itertools
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from modelsec.errors import KeyMaterialError, PolicyError
from modelsec.watermark.detection import DetectionThresholds, binomial_tail
from modelsec.watermark.spread_spectrum import (
    WatermarkKey,
    WatermarkParams,
    block_statistics,
    carrier_plan,
    code_word,
    decode_message_bits,
    density_log2_for,
    generate_key_file_text,
    load_key_file,
    message_bits,
    parse_key,
    parse_message,
    solve_strength,
)

KEY = bytes(range(1, 33))


# --- keys ---------------------------------------------------------------------------------------------------


def test_key_file_hex_and_raw_forms_are_the_same_key() -> None:
    a = parse_key(KEY.hex().encode() + b"\n", source="hex")
    b = parse_key(KEY, source="raw")
    c = parse_key(b"  " + KEY.hex().upper().encode() + b"\r\n", source="upper")
    assert a.commitment() == b.commitment() == c.commitment()


def test_generated_key_file_parses_and_is_random() -> None:
    text = generate_key_file_text()
    assert len(text) == 65 and text.endswith(b"\n")
    assert (
        parse_key(text, source="k").commitment()
        != parse_key(generate_key_file_text(), source="k").commitment()
    )


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty"),
        (b"abcd\n", "too short"),
        (bytes(31), "too short"),
        (b"abc", "odd number"),
        (bytes(65), "too long"),
        (b"\x07" * 32, "repeated byte"),
        ("ab" * 31 + "a", "odd number"),
    ],
)
def test_bad_keys_raise_key_material_error(data: bytes | str, needle: str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    with pytest.raises(KeyMaterialError, match=needle):
        parse_key(raw, source="k")


def test_load_key_file_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyMaterialError, match="cannot read the watermark key file"):
        load_key_file(tmp_path / "missing.key")
    (tmp_path / "real.key").write_text(KEY.hex())
    os.symlink(tmp_path / "real.key", tmp_path / "link.key")
    with pytest.raises(KeyMaterialError, match="symlink"):
        load_key_file(tmp_path / "link.key")
    with pytest.raises(KeyMaterialError, match=r"not a regular file \(a directory\)"):
        load_key_file(tmp_path)
    os.mkfifo(tmp_path / "fifo.key")  # no writer: a blocking open would hang here
    with pytest.raises(KeyMaterialError, match=r"not a regular file \(a FIFO or pipe\)"):
        load_key_file(tmp_path / "fifo.key")
    (tmp_path / "big.key").write_bytes(b"0" * 5000)
    with pytest.raises(KeyMaterialError, match="larger than"):
        load_key_file(tmp_path / "big.key")
    assert load_key_file(tmp_path / "real.key").commitment() == WatermarkKey.from_bytes(KEY).commitment()


def test_key_never_appears_in_repr_or_commitments() -> None:
    key = WatermarkKey.from_bytes(KEY)
    shown = repr(key) + key.commitment() + key.message_commitment(b"m")
    assert KEY.hex() not in shown and KEY.hex()[:16] not in shown
    assert key.commitment() != WatermarkKey.from_bytes(KEY[::-1]).commitment()
    assert key.message_commitment(b"a") != key.message_commitment(b"b")
    assert key.message_commitment(b"a") != WatermarkKey.from_bytes(KEY[::-1]).message_commitment(b"a")


def test_keystreams_are_domain_separated_aes_ctr() -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = WatermarkKey.from_bytes(KEY)
    a = key.stream(b"blocks", b"ctx", 64)
    assert a == key.stream(b"blocks", b"ctx", 64)
    assert key.stream(b"blocks", b"ctx", 32) == a[:32]  # a prefix: the stream does not depend on its length
    assert a != key.stream(b"signs", b"ctx", 64) and a != key.stream(b"blocks", b"ctx2", 64)
    enc = Cipher(algorithms.AES(key.subkey(b"blocks", b"ctx")), modes.CTR(bytes(16))).encryptor()
    assert a == enc.update(bytes(64))


# --- messages and code words --------------------------------------------------------------------------------


def test_parse_message_forms() -> None:
    assert parse_message("ACME v1") == b"ACME v1"
    assert parse_message("hex:00ff") == b"\x00\xff"
    assert parse_message("0xdeadbeef") == bytes.fromhex("deadbeef")
    for bad in ("", "hex:", "hex:zz", "0x123"):
        with pytest.raises(PolicyError):
            parse_message(bad)


def test_code_word_pilot_is_independent_of_the_message_and_decodes() -> None:
    key = WatermarkKey.from_bytes(KEY)
    params = WatermarkParams(message_code="none")  # the format of every mark made before error correction
    msg = b"hello, world"
    code = code_word(key, message_bits(msg), params)
    assert len(code) == params.pilot_bits + 8 * len(msg)
    assert code[: params.pilot_bits] == code_word(key, [], params)
    assert set(code) == {-1, 1}
    assert decode_message_bits(key, code, params) == msg
    zeros = code_word(key, [0] * 256, params)[params.pilot_bits :]
    assert 96 < sum(c > 0 for c in zeros) < 160  # whitened: balanced even for an all-zero message


# --- carriers -----------------------------------------------------------------------------------------------


def test_density_rule() -> None:
    p = WatermarkParams()
    assert density_log2_for(300_000, p) == 0
    assert density_log2_for(2**21, p) == 0
    assert density_log2_for(2**22, p) == 1
    assert density_log2_for(22_700_000, p) == 3
    assert density_log2_for(2**21 * 1000, p) == 9
    assert density_log2_for(10**9, WatermarkParams(density_log2=5)) == 5


def test_carrier_plan_is_keyed_stratified_and_balanced() -> None:
    key = WatermarkKey.from_bytes(KEY)
    params = WatermarkParams()
    plan = carrier_plan(key, "layer.weight", (512, 1024), 3, params)
    g = params.block_size
    n_super = 512 * 1024 // g >> 3
    assert plan.blocks.shape == (n_super,) and plan.signs.shape == (n_super, g)
    assert np.array_equal(plan.blocks >> 3, np.arange(n_super))  # exactly one block per super-block
    assert abs(float((plan.signs > 0).mean()) - 0.5) < 0.01
    counts = np.bincount(plan.slots % 320, minlength=320)
    assert counts.min() > 0 and abs(counts.mean() - n_super / 320) < 1e-9
    again = carrier_plan(key, "layer.weight", (512, 1024), 3, params)
    assert np.array_equal(plan.blocks, again.blocks) and np.array_equal(plan.signs, again.signs)
    other = carrier_plan(key, "other.weight", (512, 1024), 3, params)
    assert not np.array_equal(plan.signs, other.signs)
    other_key = carrier_plan(WatermarkKey.from_bytes(KEY[::-1]), "layer.weight", (512, 1024), 3, params)
    assert not np.array_equal(plan.blocks, other_key.blocks)


def test_params_are_validated() -> None:
    for bad in (
        {"kappa": 0.0},
        {"kappa": float("nan")},
        {"block_size": 12},
        {"max_relative_change": 1.0},
        {"pilot_bits": 4},
        {"max_message_bits": 100},
        {"density_log2": 99},
    ):
        with pytest.raises(PolicyError, match="invalid watermark parameters"):
            WatermarkParams(**bad)
    with pytest.raises(PolicyError):
        DetectionThresholds(min_confidence=1.5)
    with pytest.raises(PolicyError):
        DetectionThresholds(max_false_positive=0.0)


# --- binomial tail ------------------------------------------------------------------------------------------


def test_binomial_tail_matches_brute_force() -> None:
    for n in range(0, 13):
        outcomes = list(itertools.product((0, 1), repeat=n))
        for k in range(-1, n + 2):
            expected = Fraction(sum(1 for o in outcomes if sum(o) >= k), 2**n)
            p, log10 = binomial_tail(n, k)
            assert p == float(expected)
            if expected:
                assert log10 == pytest.approx(math.log10(expected), abs=1e-12)
            else:
                assert log10 == -math.inf


def test_binomial_tail_known_values_and_underflow() -> None:
    p, _ = binomial_tail(64, 62)
    assert p == (1 + 64 + 2016) / 2**64
    p, log10 = binomial_tail(1100, 1100)
    assert p == 0.0  # 2**-1100 underflows a double ...
    assert log10 == pytest.approx(-1100 * math.log10(2))  # ... the log10 does not
    assert binomial_tail(320, 160)[0] > 0.5


# --- embedding rule -----------------------------------------------------------------------------------------


def test_solve_strength_reaches_the_target_exactly() -> None:
    rng = np.random.default_rng(0)
    params = WatermarkParams(block_size=32)
    key = WatermarkKey.from_bytes(KEY)
    plan = carrier_plan(key, "w", (256, 256), 0, params)
    w = rng.standard_normal((plan.blocks.size, 32)).astype(np.float64)
    stats = block_statistics(w, plan, full=True)
    assert stats is not None and stats.a is not None and stats.q is not None
    n_code = 16
    bit = (stats.slots % n_code).astype(np.intp)
    sums = [
        np.asarray(np.bincount(bit, weights=x, minlength=n_code), dtype=np.float64)
        for x in (stats.c, stats.e, stats.a, stats.q)
    ]
    code = [1, -1] * 8
    t = solve_strength(code, sums[0], sums[1], sums[2], sums[3], target=3.0)
    assert np.all(t >= 0) and np.all(np.isfinite(t))
    new = w + (np.asarray(code)[bit] * t[bit])[:, None] * plan.signs * np.abs(w)
    # Same normalisation as at embedding time: the host RMS.
    x = new / stats.rms
    c = np.bincount(bit, weights=(x * plan.signs).sum(1), minlength=n_code)
    e = np.bincount(bit, weights=(x * x).sum(1), minlength=n_code)
    z = np.asarray(code) * c / np.sqrt(e)
    assert np.allclose(np.where(t > 0, z, 3.0), 3.0, atol=1e-9)
    assert np.all(z >= 3.0 - 1e-9)
    assert np.all(np.abs(new - w) <= t.max() * np.abs(w) + 1e-12)
