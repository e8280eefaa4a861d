"""OMS path order: modelsec's model root digest equals model_signing's, and each verifies the other's bundle.

model_signing sorts resources as `PurePosixPath` sorts (path components, not bytes), so `tokenizer/x`
comes *after* `tokenizer.json` although `/` (0x2F) sorts after `.` (0x2E) byte by byte. The subject digest
is SHA-256 over the resource digests in that order, so any other order gives the same files another
identity.
"""

from __future__ import annotations

import json
import string
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsec.algorithms import HashAlgorithm, SignatureAlgorithm
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.keys import generate_private_key_pem
from modelsec.signer.layout import MODEL_IGNORE_PATHS
from modelsec.signer.signing import compute_manifests
from modelsec.verifier import verify_model

ms_signing = pytest.importorskip("model_signing.signing")
ms_verifying = pytest.importorskip("model_signing.verifying")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("oms-keys")
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (d / "k.pem").write_bytes(private)
    (d / "k.pub").write_bytes(public)
    return d / "k.pem", d / "k.pub"


def _write_tree(root: Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"name": name, "i": i}))  # valid JSON whatever the suffix


def _ms_sign(model: Path, sig: Path, key: Path) -> dict[str, object]:
    ms_signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(
        __import__("model_signing.hashing", fromlist=["Config"]).Config().set_ignored_paths(paths=[sig])
    ).sign(model, sig)
    bundle = json.loads(sig.read_text())
    import base64

    return json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))  # type: ignore[no-any-return]


def _ms_verify(model: Path, sig: Path, pub: Path) -> None:
    ms_verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, sig)


def _modelsec_root(model: Path) -> str:
    m = compute_manifests(model, [HashAlgorithm.SHA256], ignore_paths=MODEL_IGNORE_PATHS, tensor_hash=None)
    return m[HashAlgorithm.SHA256].subject_digest["sha256"]


PREFIX_NAMES = [
    "tokenizer.json",
    "tokenizer/vocab.txt",
    "tokenizer/merges.txt",
    "checkpoint/a.bin.txt",
    "checkpoint-100/a.txt",
    "checkpoint_2/b.txt",
    "config.json",
]


def test_prefix_siblings_same_root_and_both_directions(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    model = tmp_path / "m"
    _write_tree(model, PREFIX_NAMES)

    payload = _ms_sign(model, tmp_path / "ms.sig", private)
    ms_root = payload["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    ms_names = [r["name"] for r in payload["predicate"]["resources"]]  # type: ignore[index]
    assert ms_names == [str(p) for p in sorted(PurePosixPath(n) for n in PREFIX_NAMES)]
    assert _modelsec_root(model) == ms_root

    policy = Policy.from_key_files([public])
    assert verify_model(model, policy, bundles=[tmp_path / "ms.sig"]).root_digest == ms_root

    result = sign_model(model, [load_private_key_file(private)], tensor_hash=None)
    assert result.root_digest == ms_root
    _ms_verify(model, model / "model.sig", public)


_SEGMENT = st.text(
    alphabet=string.ascii_lowercase[:3] + string.digits[:2] + "-._", min_size=1, max_size=4
).filter(lambda s: s not in (".", "..") and not s.startswith(".git"))
_PATHS = st.lists(st.lists(_SEGMENT, min_size=1, max_size=3), min_size=1, max_size=8)


def _clean(paths: list[list[str]]) -> list[str]:
    # Drop paths that would need a file and a directory of the same name, and case/duplicate collisions.
    chosen: list[str] = []
    for parts in paths:
        name = "/".join(parts)
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts))}
        clash = any(
            c == name or c in prefixes or c.startswith(name + "/") or c.casefold() == name.casefold()
            for c in chosen
        )
        if not clash and not any(p.casefold() in {c.casefold() for c in chosen} for p in prefixes):
            chosen.append(name)
    return chosen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_PATHS)
def test_random_trees_match_model_signing(
    tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path], paths: list[list[str]]
) -> None:
    names = _clean(paths)
    private, public = keys
    base = tmp_path_factory.mktemp("tree")
    model = base / "m"
    _write_tree(model, names)
    payload = _ms_sign(model, base / "ms.sig", private)
    ms_root = payload["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    assert _modelsec_root(model) == ms_root
    assert (
        verify_model(model, Policy.from_key_files([public]), bundles=[base / "ms.sig"]).root_digest == ms_root
    )
    sign_model(model, [load_private_key_file(private)], tensor_hash=None)
    _ms_verify(model, model / "model.sig", public)
