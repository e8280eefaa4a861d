"""The ServerConfig file is validated strictly, and access rules fail closed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import PolicyError
from modelsec.service.config import ACCESS_DEFAULTS, identity_allowed, load_server_config

BASE: dict[str, Any] = {
    "apiVersion": "modelsec.dev/v1alpha1",
    "kind": "ServerConfig",
    "listen": "127.0.0.1:50051",
    "dataDir": "data",
    "policy": "policy.yaml",
    "allowAnonymous": True,
}


def _load(tmp_path: Path, **fields: Any) -> Any:
    doc = {**BASE, **fields}
    for k in [k for k, v in doc.items() if v is None]:
        del doc[k]
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps(doc))
    return load_server_config(path)


def test_minimal_config_resolves_paths_against_its_directory(tmp_path: Path) -> None:
    config = _load(tmp_path)
    assert config.data_dir == tmp_path / "data" and config.policy == tmp_path / "policy.yaml"
    assert config.access == dict(ACCESS_DEFAULTS) and config.grace_period == 30.0


def test_yaml_with_keys_tokens_and_tls(tmp_path: Path) -> None:
    (tmp_path / "server.yaml").write_text(
        """
apiVersion: modelsec.dev/v1alpha1
kind: ServerConfig
listen: "[::1]:0"
dataDir: /var/lib/modelsec
policy: policy.yaml
tls: {cert: s.pem, key: s.key, clientCA: ca.pem}
tokens: [{identity: ci, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
keys:
  - {name: ci-p256, version: "2", path: k.pem, roles: [weights], allow: ["spiffe://x/*"]}
access: {putAttestation: [ci]}
gracePeriod: 5
"""
    )
    config = load_server_config(tmp_path / "server.yaml")
    assert config.tls is not None and config.tls.client_ca == tmp_path / "ca.pem"
    assert config.keys[0].key_version == "ci-p256/2" and config.keys[0].roles == {"weights"}
    assert config.may("putAttestation", "ci") and not config.may("putAttestation", "other")
    assert config.may("verify", "anyone") and not config.may("robustness", "ci")


@pytest.mark.parametrize(
    ("fields", "mentions"),
    [
        ({"listen": "50051"}, "listen must be HOST:PORT"),
        ({"listen": "h:70000"}, "port out of range"),
        ({"kind": "ModelPolicy"}, "kind must be 'ServerConfig'"),
        ({"apiVersion": "v1"}, "apiVersion"),
        ({"bogus": 1}, r"unknown field\(s\) \['bogus'\]"),
        ({"allowAnonymous": None}, "no way to authenticate clients"),
        ({"allowAnonymous": "yes"}, "allowAnonymous must be true or false"),
        ({"tls": {"cert": "c", "key": "k"}}, "allowAnonymous is for plaintext development only"),
        ({"tls": {"cert": "c", "key": "k"}, "allowAnonymous": None}, "no way to authenticate clients"),
        ({"tokens": [{"identity": "ci", "sha256": "secret"}]}, "64 lowercase hex"),
        (
            {"keys": [{"name": "k", "path": "k.pem", "roles": ["admin"]}]},
            r"keys\[0\]\.roles\[0\] must be .*, got 'admin'",
        ),
        ({"keys": [{"name": "k", "path": "a"}, {"name": "k", "path": "b"}]}, "listed twice"),
        ({"keys": [{"name": "../k", "path": "a"}]}, "name and version must match"),
        (
            {"keys": [{"name": "k", "path": "a", "roles": ["weights"], "operations": ["gateResult"]}]},
            "operation gateResult needs the role gate",
        ),
        ({"keys": [{"name": "k", "path": "a", "operations": []}]}, r"keys\[0\]\.operations"),
        ({"keys": [{"name": "k", "path": "a", "operations": ["sign"]}]}, r"keys\[0\]\.operations\[0\]"),
        ({"serverIdentity": "a\nb"}, "serverIdentity"),
        ({"serverIdentity": "s" * 1025}, "serverIdentity"),
        ({"access": {"admin": ["*"]}}, r"unknown field\(s\) \['admin'\]"),
        ({"access": {"verify": "*"}}, "must be a list"),
        ({"gracePeriod": -1}, "gracePeriod"),
        ({"maxConcurrentRpcs": 0}, "maxConcurrentRpcs"),
        ({"maxConcurrentGates": 0}, "maxConcurrentGates"),
    ],
)
def test_invalid_configs_name_the_field(tmp_path: Path, fields: dict[str, Any], mentions: str) -> None:
    with pytest.raises(PolicyError, match=mentions):
        _load(tmp_path, **fields)


def test_key_operations_default_to_one_per_role(tmp_path: Path) -> None:
    """A key left without `operations` never signs client-made gate or watermark statements (issue 14)."""
    config = _load(
        tmp_path,
        serverIdentity="signer.example.org",
        keys=[
            {"name": "all", "path": "a"},
            {"name": "gate", "path": "a", "roles": ["gate"]},
            {"name": "client", "path": "a", "roles": ["gate"], "operations": ["signStatement"]},
        ],
    )
    assert [k.operations for k in config.keys] == [
        {"signStatement", "gateResult", "watermarkRecord"},
        {"gateResult"},
        {"signStatement"},
    ]
    assert config.server_identity == "signer.example.org"
    assert _load(tmp_path).server_identity  # default: this host's name


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps(BASE)[:-1] + ', "listen": "127.0.0.1:1"}')
    with pytest.raises(PolicyError, match="duplicate key 'listen'"):
        load_server_config(path)


def test_unreadable_config(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the server configuration"):
        load_server_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("identity", "patterns", "allowed"),
    [
        ("spiffe://example.org/ci/signer", ["spiffe://example.org/ci/*"], True),
        ("spiffe://example.org/cd/signer", ["spiffe://example.org/ci/*"], False),
        ("ci", [], False),
        ("CI", ["ci"], False),
        ("anything", ["*"], True),
    ],
)
def test_identity_globs(identity: str, patterns: list[str], allowed: bool) -> None:
    assert identity_allowed(identity, patterns) is allowed
