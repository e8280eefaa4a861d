"""Hypothesis properties of sign → verify on arbitrary model directories."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import VerificationError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model

NAMES = st.text(alphabet="abcdefgh_-.0123456789", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..") and not s.startswith(".") and not s.endswith(".safetensors")
)
FILES = st.dictionaries(
    st.lists(NAMES, min_size=1, max_size=2).map("/".join), st.binary(max_size=300), min_size=1, max_size=5
).filter(lambda d: not any(a != b and b.startswith(a + "/") for a in d for b in d))
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _write(root: Path, files: dict[str, bytes], order: list[str] | None = None) -> None:
    for name in order or list(files):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(files[name])
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"w": arr, "b": arr[0].copy()}, str(root / "model.safetensors"))


@pytest.fixture(scope="module")
def keys(key_dir: Path) -> tuple[list[object], Policy]:
    signers = [load_private_key_file(key_dir / f"{a}.key.pem") for a in ("ecdsa-p256", "sm2")]
    policy = Policy.from_key_files(
        [key_dir / "ecdsa-p256.pub.pem", key_dir / "sm2.pub.pem"],
        require=[SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.SM2],
    )
    # The properties are about digests and the file set. Random file bytes can look like a pickle or a zip
    # archive (a drawn file began with a zip header once), which the default policy refuses as content, not
    # as tampering: the content rules have their own tests (tests/attacks, tests/unit/modelformat).
    return signers, dataclasses.replace(policy, refuse_pickle=False)


def _casefold_unique(files: dict[str, bytes]) -> bool:
    return len({n.casefold() for n in files}) == len(files)


@SETTINGS
@given(files=FILES.filter(_casefold_unique), data=st.data())
def test_round_trip_and_any_byte_flip_fails(keys, files: dict[str, bytes], data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    signers, policy = keys
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "m"
        root.mkdir()
        _write(root, files)
        signed = sign_model(root, signers)
        assert verify_model(root, policy).root_digest == signed.root_digest
        # Bundles have their own property below (their hint/keyid bytes are deliberately unsigned).
        candidates = [
            p for p in root.rglob("*") if p.is_file() and p.stat().st_size > 0 and p.suffix != ".sig"
        ]
        victim = data.draw(st.sampled_from(sorted(candidates)))
        raw = bytearray(victim.read_bytes())
        # Signatures vary in length from one signing to the next: draw a position independent of the length
        # (a length-dependent strategy makes hypothesis's replay draw differently and fail as flaky).
        offset = data.draw(st.integers(0, 2**20)) % len(raw)
        raw[offset] ^= data.draw(st.integers(1, 255))
        victim.write_bytes(bytes(raw))
        with pytest.raises(VerificationError):
            verify_model(root, policy)


@SETTINGS
@given(files=FILES.filter(_casefold_unique), data=st.data())
def test_add_remove_rename_fails(keys, files: dict[str, bytes], data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    signers, policy = keys
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "m"
        root.mkdir()
        _write(root, files)
        sign_model(root, signers)
        action = data.draw(st.sampled_from(["add", "remove", "rename"]))
        victim = root / data.draw(st.sampled_from(sorted(files)))
        if action == "add":
            (root / "zz_added.bin").write_bytes(b"")
        elif action == "remove":
            victim.unlink()
        else:
            victim.rename(victim.with_name(victim.name + "_renamed"))
        with pytest.raises(VerificationError):
            verify_model(root, policy)


@SETTINGS
@given(files=FILES.filter(_casefold_unique), seed=st.integers(0, 2**32 - 1))
def test_root_digest_independent_of_creation_order(keys, files: dict[str, bytes], seed: int) -> None:  # type: ignore[no-untyped-def]
    signers, _ = keys
    order = list(files)
    np.random.default_rng(seed).shuffle(order)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.mkdir()
        b.mkdir()
        _write(a, files)
        _write(b, files, order)
        assert sign_model(a, signers[:1]).root_digest == sign_model(b, signers[:1]).root_digest


def _signed_content(raw: bytes) -> tuple[object, ...] | None:
    """What the signature covers, or None when the bytes are not a parseable bundle."""
    import base64
    import json

    try:
        env = json.loads(raw)["dsseEnvelope"]
        return (
            env["payloadType"],
            base64.b64decode(env["payload"], validate=True),
            [base64.b64decode(s["sig"], validate=True) for s in env["signatures"]],
            json.loads(raw)["mediaType"],
        )
    except Exception:  # noqa: BLE001 - any parse failure means "not the same bundle"
        return None


@SETTINGS
@given(data=st.data())
def test_any_bundle_byte_flip_fails(keys, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    signers, policy = keys
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "m"
        root.mkdir()
        _write(root, {"config.json": b"{}"})
        sign_model(root, signers)
        bundle = root / data.draw(st.sampled_from(["model.sig", "model.sm2.sig"]))
        original = bundle.read_bytes()
        raw = bytearray(original)
        # Signatures vary in length from one signing to the next: draw a position independent of the length
        # (a length-dependent strategy makes hypothesis's replay draw differently and fail as flaky).
        offset = data.draw(st.integers(0, 2**20)) % len(raw)
        raw[offset] ^= data.draw(st.integers(1, 255))
        bundle.write_bytes(bytes(raw))
        try:
            verify_model(root, policy)
        except VerificationError:
            return
        # Accepted only if the flip left everything the signature covers unchanged (an untrusted hint or
        # keyid, or a non-canonical base64 bit that decodes to the same bytes).
        assert _signed_content(bytes(raw)) == _signed_content(original)
