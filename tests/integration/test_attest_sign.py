"""`modelsec attest sign --predicate-type URI --predicate FILE` (issue 29.1): any predicate, signed, stored.

Signed by a local PEM key, a `pkcs11:` key (SoftHSM2) or the gRPC service (a key whose `predicateTypes` names
the type; other types refused); written beside the model, into a store, into the registry as a referrer; read
back with `verified_statements`, which returns only statements of the type, about the model, by a trusted
signer. The CLI in-process; real registry, token and server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelsec.distribution.push_pull import push_model
from modelsec.policy import Policy
from modelsec.registry.client import RegistryOptions
from modelsec.signer.keys import load_private_key_file
from modelsec.signer.signing import sign_model
from modelsec.verifier.attestations import find_statement_files, verified_statements
from modelsec.verifier.stores import StoreOptions, open_store
from tests.conftest import run_cli, write_tiny_model
from tests.support.oci import PASSWORD, USER, Registry
from tests.support.service import InThreadServer, write_server_config
from tests.support.softhsm import Token

pytestmark = pytest.mark.integration

EVAL = "https://example.org/model-eval/v1"
PREDICATE = {"suite": "helm-lite", "scores": {"mmlu": 0.61}}


def _model(tmp_path: Path, key_dir: Path, seed: int) -> tuple[Path, str, Path]:
    model = write_tiny_model(tmp_path / f"m{seed}", seed=seed)
    root = sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]).root_digest
    predicate = tmp_path / "eval.json"
    predicate.write_text(json.dumps(PREDICATE))
    return model, root, predicate


def _policy(*keys: Path) -> Policy:
    return Policy.from_key_files(list(keys))


def test_local_key_beside_the_model_is_selected_by_type_for_that_signer_only(
    tmp_path: Path, key_dir: Path
) -> None:
    model, root, predicate = _model(tmp_path, key_dir, 61)
    r = run_cli(
        "attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate,
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["rootDigest"] == f"sha256:{root}" and out["path"] == str(
        model / "model.attestations" / "example.org-model-eval-v1.sig"
    )
    found = find_statement_files(model)
    chosen = verified_statements(root, found, _policy(key_dir / "ecdsa-p256.pub.pem"), EVAL)
    (one,) = chosen.statements
    assert dict(one.statement.predicate) == PREDICATE and one.signer.name == "ecdsa-p256.pub.pem"
    assert chosen.ignored == ()  # the weights signature is another type: skipped, not listed
    # Another signer, another model, another type: nothing selected.
    untrusted = verified_statements(root, found, _policy(key_dir / "other.pub.pem"), EVAL)
    assert untrusted.statements == () and "signature" in untrusted.ignored[0]
    other_model = verified_statements("ab" * 32, found, _policy(key_dir / "ecdsa-p256.pub.pem"), EVAL)
    assert other_model.statements == () and "is about model" in other_model.ignored[0]
    assert (
        verified_statements(root, found, _policy(key_dir / "ecdsa-p256.pub.pem"), EVAL + "x").statements == ()
    )
    # The weights still verify: the new bundle is no unsigned extra file.
    v = run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem")
    assert v.returncode == 0, v.stderr
    # An existing bundle is not replaced without --force.
    again = run_cli(
        "attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate,
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json",
    )  # fmt: skip
    assert again.returncode == 1 and json.loads(again.stdout)["error"]["kind"] == "BundleExistsError"


@pytest.mark.parametrize(
    ("ptype", "content", "kind"),
    [
        ("not a uri", json.dumps(PREDICATE), "MalformedArtifactError"),
        ("ftp://example.org/x", json.dumps(PREDICATE), "MalformedArtifactError"),
        (EVAL, "[1, 2]", "MalformedArtifactError"),
        (EVAL, '{"a": 1, "a": 2}', "MalformedArtifactError"),
        ("https://modelsec.dev/robustness-gate/v1", json.dumps(PREDICATE), "MalformedArtifactError"),
        ("https://modelsec.dev/oci-binding/v2", json.dumps(PREDICATE), "MalformedArtifactError"),
    ],
    ids=["not-uri", "ftp", "not-object", "duplicate-key", "malformed-gate", "binding"],
)
def test_bad_predicates_are_refused_and_nothing_written(
    tmp_path: Path, key_dir: Path, ptype: str, content: str, kind: str
) -> None:
    model, _, predicate = _model(tmp_path, key_dir, 62)
    predicate.write_text(content)
    before = sorted(p.name for p in model.iterdir())
    r = run_cli(
        "attest", "sign", model, "--predicate-type", ptype, "--predicate", predicate,
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json",
    )  # fmt: skip
    assert r.returncode == 1, r.stdout
    assert json.loads(r.stdout)["error"]["kind"] in (kind, "AttestationError")
    assert sorted(p.name for p in model.iterdir()) == before


def test_pkcs11_key_into_a_directory_store(tmp_path: Path, key_dir: Path, softhsm_token: Token) -> None:
    model, root, predicate = _model(tmp_path, key_dir, 63)
    store = tmp_path / "store"
    r = run_cli(
        "attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate,
        "--signing-key", softhsm_token.uri(), "--out", "-", "--store", store, "--json",
        env=softhsm_token.env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] is None
    opened = open_store(str(store), StoreOptions())
    entries = opened.entries(root)
    opened.close()
    chosen = verified_statements(root, entries, _policy(softhsm_token.public_key("release")), EVAL)
    assert [dict(s.statement.predicate) for s in chosen.statements] == [PREDICATE]
    assert verified_statements(root, entries, _policy(key_dir / "ecdsa-p256.pub.pem"), EVAL).statements == ()


def test_into_the_registry_as_a_referrer(tmp_path: Path, key_dir: Path, registry: Registry) -> None:
    model, root, predicate = _model(tmp_path, key_dir, 64)
    key = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
    policy = _policy(key_dir / "ecdsa-p256.pub.pem")
    push_model(model, f"oci://{registry.address}/models/attested-eval:v1", policy, key, options=options)
    store = f"oci://{registry.address}/models/attested-eval"
    r = run_cli(
        "attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate,
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--out", "-", "--store", store, "--json",
        env=registry.env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stored"].startswith(f"{store}@sha256:")
    opened = open_store(store, StoreOptions(registry=options))
    entries = opened.entries(root)
    opened.close()
    (one,) = verified_statements(root, entries, policy, EVAL).statements
    assert dict(one.statement.predicate) == PREDICATE


def test_signing_service_signs_the_types_its_key_names_and_refuses_others(
    tmp_path: Path, key_dir: Path
) -> None:
    # Its own server: the session server's keys name no predicateTypes.
    config = write_server_config(
        tmp_path / "srv",
        key_dir,
        keys=[
            {
                "name": "ci-p256",
                "path": str(key_dir / "ecdsa-p256.key.pem"),
                "allow": ["*"],
                "roles": ["weights"],
                "predicateTypes": [EVAL],
            }
        ],
    )
    model, root, predicate = _model(tmp_path, key_dir, 65)
    with InThreadServer(config) as server:
        args = ["--server", server.target, "--plaintext", "--key-version", "ci-p256/1", "--json"]
        r = run_cli("attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate, *args)
        assert r.returncode == 0, r.stderr
        refused = run_cli(
            "attest", "sign", model, "--predicate-type", "https://example.org/other/v1", "--predicate",
            predicate, "--out", tmp_path / "other.sig", *args,
        )  # fmt: skip
    assert refused.returncode == 1
    error = json.loads(refused.stdout)["error"]
    assert error["kind"] == "PermissionDeniedError" and "https://example.org/other/v1" in error["message"]
    assert not (tmp_path / "other.sig").exists()
    chosen = verified_statements(
        root, find_statement_files(model), _policy(key_dir / "ecdsa-p256.pub.pem"), EVAL
    )
    assert len(chosen.statements) == 1


def test_server_config_refuses_predicate_types_that_are_not_uris_or_are_registered(
    tmp_path: Path, key_dir: Path
) -> None:
    from modelsec.errors import PolicyError
    from modelsec.service.config import load_server_config

    for bad in ("not a uri", "https://modelsec.dev/robustness-gate/v1"):
        config = write_server_config(
            tmp_path / "srv",
            key_dir,
            keys=[{"name": "k", "path": str(key_dir / "ecdsa-p256.key.pem"), "predicateTypes": [bad]}],
        )
        with pytest.raises(PolicyError, match="predicateTypes"):
            load_server_config(config)


def test_a_model_signed_by_model_signing_still_verifies_with_statements_beside_it(
    tmp_path: Path, key_dir: Path
) -> None:
    # model_signing records no model.attestations in its ignore list: modelsec's verify leaves the reserved
    # folder out of every walk, whichever manifest signed the files.
    signing = pytest.importorskip("model_signing.signing")
    model = write_tiny_model(tmp_path / "ms", seed=66)
    signing.Config().use_elliptic_key_signer(private_key=key_dir / "ecdsa-p256.key.pem").sign(
        model, model / "model.sig"
    )
    predicate = tmp_path / "eval.json"
    predicate.write_text(json.dumps(PREDICATE))
    r = run_cli(
        "attest", "sign", model, "--predicate-type", EVAL, "--predicate", predicate,
        "--signing-key", key_dir / "ecdsa-p256.key.pem", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    v = run_cli("verify", model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert v.returncode == 0, v.stdout
    assert json.loads(v.stdout)["rootDigest"] == json.loads(r.stdout)["rootDigest"]
