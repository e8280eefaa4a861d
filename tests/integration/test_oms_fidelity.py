"""OMS fidelity against model_signing 1.1.1 in-process (the main test environment's `model-signing`).

Each test is one issue-15 finding: what a user of both tools sees, checked with both verifiers.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from modelsec.algorithms import HashAlgorithm
from modelsec.attestations.bundle import sign_statement
from modelsec.attestations.predicates.oms import Resource, manifest_statement, root_digest
from modelsec.errors import FileSetMismatchError, MalformedArtifactError, VerificationError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.layout import MODEL_IGNORE_PATHS
from modelsec.signer.signing import compute_manifests
from modelsec.verifier import verify_model
from tests.conftest import run_cli, write_tiny_model

ms_signing = pytest.importorskip("model_signing.signing")
ms_verifying = pytest.importorskip("model_signing.verifying")
ms_hashing = pytest.importorskip("model_signing.hashing")

pytestmark = pytest.mark.integration


def _model(root: Path) -> Path:
    write_tiny_model(root)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    (root / "checkpoint-100").mkdir()
    (root / "checkpoint-100" / "state.json").write_text("{}")
    (root / "checkpoint").mkdir()
    (root / "checkpoint" / "state.json").write_text('{"x": 2}')
    return root


def _ms_sign(
    model: Path, sig: Path, key: Path, *, hashing: object | None = None, ignore: bool = True
) -> None:
    cfg = hashing or ms_hashing.Config()
    if ignore:
        cfg.set_ignored_paths(paths=[sig])  # type: ignore[attr-defined]
    ms_signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(cfg).sign(model, sig)


def _ms_verify(model: Path, sig: Path, pub: Path) -> None:
    ms_verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, sig)


def _payload(sig: Path) -> dict[str, object]:
    return json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))  # type: ignore[no-any-return]


def test_legacy_byte_order_bundle_keeps_verifying(tmp_path: Path, key_dir: Path) -> None:
    """A bundle modelsec signed before the OMS order (resources byte-sorted) verifies with its own root."""
    model = _model(tmp_path / "m")
    m = compute_manifests(model, [HashAlgorithm.SHA256], ignore_paths=MODEL_IGNORE_PATHS, tensor_hash=None)[
        HashAlgorithm.SHA256
    ]
    legacy = sorted(m.resources, key=lambda r: r.name.encode())
    assert [r.name for r in legacy] != [r.name for r in m.resources]  # the layout tells the orders apart
    legacy_root = root_digest([r.digest for r in legacy]).hex()
    import dataclasses
    from types import MappingProxyType

    old = dataclasses.replace(
        m, resources=tuple(legacy), subject_digest=MappingProxyType({"sha256": legacy_root})
    )
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    (model / "model.sig").write_bytes(sign_statement(manifest_statement(old), key))
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    assert verify_model(model, policy).root_digest == legacy_root
    _ms_verify(model, model / "model.sig", key_dir / "ecdsa-p256.pub.pem")  # OMS accepts it as well

    # The subject must match the listed order: the same resources under the OMS root are refused.
    wrong = dataclasses.replace(old, subject_digest=m.subject_digest)
    (model / "model.sig").write_bytes(sign_statement(manifest_statement(wrong), key))
    with pytest.raises(MalformedArtifactError, match="subject digest"):
        verify_model(model, policy)

    # Signing again gives the OMS root, equal to `digest`.
    new = sign_model(model, [key], tensor_hash=None, force=True)
    assert new.root_digest == m.subject_digest["sha256"] != legacy_root
    r = run_cli("digest", model, "--json")
    assert json.loads(r.stdout)["rootDigest"] == f"sha256:{new.root_digest}"


def test_null_and_absent_keyid(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    doc = json.loads((model / "model.sig").read_text())
    for value in (None, "absent"):
        sig = doc["dsseEnvelope"]["signatures"][0]
        if value == "absent":
            sig.pop("keyid", None)
        else:
            sig["keyid"] = value
        (model / "model.sig").write_text(json.dumps(doc))
        assert verify_model(model, policy).files == 6
    doc["dsseEnvelope"]["signatures"][0]["keyid"] = 7
    (model / "model.sig").write_text(json.dumps(doc))
    with pytest.raises(MalformedArtifactError, match="keyid"):
        verify_model(model, policy)
    # Trust still comes from the policy key only.
    doc["dsseEnvelope"]["signatures"][0]["keyid"] = None
    (model / "model.sig").write_text(json.dumps(doc))
    with pytest.raises(VerificationError):
        verify_model(model, Policy.from_key_files([key_dir / "other.pub.pem"]))


def test_single_file_both_directions(tmp_path: Path, key_dir: Path) -> None:
    d = tmp_path / "d"
    model = write_tiny_model(d) / "model-00001-of-00002.safetensors"
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    _ms_sign(model, tmp_path / "ms.sig", priv, ignore=False)
    assert [r["name"] for r in _payload(tmp_path / "ms.sig")["predicate"]["resources"]] == ["."]  # type: ignore[index]
    policy = Policy.from_key_files([pub])
    ms_root = _payload(tmp_path / "ms.sig")["subject"][0]["digest"]["sha256"]  # type: ignore[index]
    assert verify_model(model, policy, bundles=[tmp_path / "ms.sig"]).root_digest == ms_root
    with pytest.raises(MalformedArtifactError, match="single file"):
        verify_model(d, policy, bundles=[tmp_path / "ms.sig"])

    r = run_cli("sign", model, "--signing-key", priv, "--signature", tmp_path / "ours.sig")
    assert r.returncode == 0, r.stderr
    _ms_verify(model, tmp_path / "ours.sig", pub)
    r = run_cli("verify", model, "--trusted-key", pub, "--signature", tmp_path / "ours.sig")
    assert r.returncode == 0 and ms_root in r.stdout, r.stderr
    r = run_cli("digest", model, "--json")
    assert json.loads(r.stdout)["rootDigest"] == f"sha256:{ms_root}"

    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    for sig in ("ms.sig", "ours.sig"):
        with pytest.raises(VerificationError):
            verify_model(model, policy, bundles=[tmp_path / sig])


def test_bundle_written_inside_by_the_python_api(tmp_path: Path, key_dir: Path) -> None:
    """model_signing's Python API records no ignore path for its bundle; a bundle is still no model file."""
    model = _model(tmp_path / "m")
    _ms_sign(model, model / "model.sig", key_dir / "ecdsa-p256.key.pem", ignore=False)
    assert "model.sig" not in _payload(model / "model.sig")["predicate"]["serialization"]["ignore_paths"]  # type: ignore[index]
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    assert verify_model(model, policy).files == 9
    (model / "stray.txt").write_text("x")
    with pytest.raises(FileSetMismatchError, match="stray"):
        verify_model(model, policy)


def test_model_signing_ecdsa_plus_modelsec_sm2(tmp_path: Path, key_dir: Path) -> None:
    model = _model(tmp_path / "m")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref")
    _ms_sign(model, model / "model.sig", key_dir / "ecdsa-p256.key.pem")
    _ms_verify(model, model / "model.sig", key_dir / "ecdsa-p256.pub.pem")
    r = run_cli("sign", model, "--signing-key", key_dir / "sm2.key.pem")
    assert r.returncode == 0, r.stderr
    args = ["--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key", key_dir / "sm2.pub.pem"]
    r = run_cli("verify", model, *args, "--require", "ecdsa-p256,sm2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert sorted(b["algorithm"] for b in out["bundles"]) == ["ecdsa-p256", "sm2"]
    assert out["rootDigest"] == "sha256:" + _payload(model / "model.sig")["subject"][0]["digest"]["sha256"]  # type: ignore[index,operator]
    (model / "tokenizer" / "vocab.json").write_text('{"a": 2}')
    r = run_cli("verify", model, *args, "--require", "ecdsa-p256,sm2")
    assert r.returncode == 1 and "vocab.json" in r.stderr


def test_custom_named_bundle_is_not_signed_next_time(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    r = run_cli("sign", model, "--signing-key", key_dir / "ecdsa-p384.key.pem", "--signature",
        model / "release.sig")
    assert r.returncode == 0, r.stderr
    r = run_cli("sign", model, "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == 6
    manifest = _payload(model / "model.sig")
    assert "release.sig" in manifest["predicate"]["serialization"]["ignore_paths"]  # type: ignore[index]
    assert "release.sig" not in [r["name"] for r in manifest["predicate"]["resources"]]  # type: ignore[index]
    keys = ["--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--trusted-key", key_dir / "ecdsa-p384.pub.pem"]
    r = run_cli("verify", model, *keys, "-s", model / "model.sig", "-s", model / "release.sig")
    assert r.returncode == 0, r.stderr


def test_ignore_paths_oms_semantics(tmp_path: Path, key_dir: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    (model / "notes").mkdir()
    (model / "notes" / "a.txt").write_text("draft")
    (model / "sub").mkdir()
    (model / "sub" / ".git").write_text("gitdir: x")  # a nested .git is a model file unless listed
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    r = run_cli("sign", model, "--signing-key", priv, "--ignore-paths", model / "notes/", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == 7
    assert "notes" in _payload(model / "model.sig")["predicate"]["serialization"]["ignore_paths"]  # type: ignore[index]
    (model / "notes" / "b.txt").write_text("more")
    _ms_verify(model, model / "model.sig", pub)
    assert run_cli("verify", model, "--trusted-key", pub).returncode == 0
    (model / "sub" / ".git").write_text("changed")
    assert run_cli("verify", model, "--trusted-key", pub).returncode == 1
    (model / "sub" / ".git").write_text("gitdir: x")

    (model / "extra.txt").write_text("unsigned")
    assert run_cli("verify", model, "--trusted-key", pub).returncode == 1
    r = run_cli("verify", model, "--trusted-key", pub, "--ignore-paths", model / "extra.txt")
    assert r.returncode == 0, r.stderr
    # A signed file can never be ignored: ignoring config.json still verifies it.
    (model / "config.json").write_text('{"model_type": "evil"}')
    r = run_cli(
        "verify",
        model,
        "--trusted-key",
        pub,
        "--ignore-paths",
        model / "extra.txt",
        "--ignore-paths",
        model / "config.json",
    )
    assert r.returncode == 1 and "config.json" in r.stderr


def test_digest_equals_verified_root_for_every_hash_type(tmp_path: Path, key_dir: Path) -> None:
    model = _model(tmp_path / "m")
    pub, priv = key_dir / "ecdsa-p256.pub.pem", key_dir / "ecdsa-p256.key.pem"
    policy = Policy.from_key_files([pub, key_dir / "sm2.pub.pem"])
    cfg = ms_hashing.Config().use_file_serialization(hashing_algorithm="blake3")
    _ms_sign(model, tmp_path / "b3.sig", priv, hashing=cfg)
    verified = verify_model(model, policy, bundles=[tmp_path / "b3.sig"]).root_digest
    r = run_cli("digest", model, "--hash-type", "blake3", "--json")
    assert json.loads(r.stdout)["rootDigest"] == f"sha256:{verified}"

    sign_model(model, [load_private_key_file(priv), load_private_key_file(key_dir / "sm2.key.pem")])
    for hash_type in ("sha256", "sm3"):
        r = run_cli("digest", model, "--hash-type", hash_type, "--json")
        assert json.loads(r.stdout)["rootDigest"] == f"sha256:{verify_model(model, policy).root_digest}"


@pytest.mark.parametrize(
    ("configure", "message"),
    [
        (lambda c: c.use_file_serialization(hashing_algorithm="blake2"), "hashing_algorithm"),
        (lambda c: c.use_shard_serialization(shard_size=64), "use_shard_serialization"),
    ],
)
def test_blake2b_and_shards_refused_naming_the_option(
    tmp_path: Path, key_dir: Path, configure: object, message: str
) -> None:
    model = write_tiny_model(tmp_path / "m")
    cfg = configure(ms_hashing.Config())  # type: ignore[operator]
    _ms_sign(model, tmp_path / "x.sig", key_dir / "ecdsa-p256.key.pem", hashing=cfg)
    with pytest.raises(MalformedArtifactError, match=message):
        verify_model(
            model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]), bundles=[tmp_path / "x.sig"]
        )


def test_resource_named_dot_only_alone(tmp_path: Path, key_dir: Path) -> None:
    from modelsec.attestations.predicates.oms import parse_manifest

    model = write_tiny_model(tmp_path / "m")
    m = compute_manifests(model, [HashAlgorithm.SHA256], ignore_paths=MODEL_IGNORE_PATHS, tensor_hash=None)[
        HashAlgorithm.SHA256
    ]
    import dataclasses

    bad = dataclasses.replace(
        m, resources=(Resource(".", HashAlgorithm.SHA256, b"\0" * 32), *m.resources[1:])
    )
    with pytest.raises(MalformedArtifactError, match="segment"):
        parse_manifest(manifest_statement(bad), what="x")
