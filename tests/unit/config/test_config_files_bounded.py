"""Policy and server configuration files: malformed YAML shapes are PolicyErrors naming the file and position,
globs match every character consistently, and bearer tokens never cross a non-loopback plaintext listener
(issue 14)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import PolicyError
from modelsec.policy import PolicySet
from modelsec.service.config import is_loopback_listen, load_server_config
from modelsec.verifier.admission import admit
from tests.support.policies import write_policy_file

TOKEN = {"identity": "ci", "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}


BAD_KEYS = [
    (b"{[a]: 1}", "line 1, column 2: a mapping key must be a string, not sequence"),
    (b"? [a, b]\n: 1\n", "line 1, column 3: a mapping key must be a string, not sequence"),
    (b"{{a: 1}: 2}", "line 1, column 2: a mapping key must be a string, not mapping"),
    (b"apiVersion: x\n? {a: 1}\n: 2\n", "line 2, column 3: a mapping key must be a string, not mapping"),
    (b"apiVersion: x\n1: 2\n", "line 2, column 1: a mapping key must be a string, not int"),
    (b"[" * 5_000, "nested too deeply"),
]


@pytest.mark.parametrize(("doc", "mentions"), BAD_KEYS)
def test_policy_file_with_unhashable_or_odd_keys(tmp_path: Path, doc: bytes, mentions: str) -> None:
    """Old code: TypeError (unhashable type: 'list') or RecursionError out of PolicySet.from_file."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(doc)
    with pytest.raises(PolicyError, match=f"{path}: .*{mentions}" if "line" in mentions else mentions):
        PolicySet.from_file(path)


@pytest.mark.parametrize(("doc", "mentions"), BAD_KEYS)
def test_server_config_with_unhashable_or_odd_keys(tmp_path: Path, doc: bytes, mentions: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_bytes(doc)
    with pytest.raises(PolicyError, match=mentions):
        load_server_config(path)


def test_nested_unhashable_key_in_policy(tmp_path: Path, key_dir: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = (
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: p\n    match: ['file:///m/*']\n    keys: [{key_dir / 'ecdsa-p256.pub.pem'}]\n"
        "    limits: {[maxFiles]: 3}\n"
    )
    path.write_text(text)
    with pytest.raises(PolicyError, match="line 7, column 14: a mapping key must be a string"):
        PolicySet.from_file(path)


@pytest.mark.parametrize("pattern", ["file:///models/*", "file:///models/**", "file:///models/a?b"])
def test_globs_treat_a_newline_like_any_character(tmp_path: Path, key_dir: Path, pattern: str) -> None:
    """Old code: `*` and `?` matched a newline, `**` did not (regex `.` without DOTALL)."""
    policies = PolicySet.from_file(
        write_policy_file(tmp_path / "policy.yaml", match=[pattern], keys=[key_dir / "ecdsa-p256.pub.pem"])
    )
    assert admit(policies, "file:///models/a\nb").policy.name == "p"


@pytest.mark.parametrize("pattern", ["file:///models/a\nb", "file:///m/\x00*", "file:///m/\x1b[2J*"])
def test_patterns_with_control_characters_are_refused(tmp_path: Path, key_dir: Path, pattern: str) -> None:
    with pytest.raises(PolicyError, match=r"policies\[0\]\.match\[0\] .* holds a control character"):
        PolicySet.from_file(
            write_policy_file(
                tmp_path / "policy.yaml", match=[pattern], keys=[key_dir / "ecdsa-p256.pub.pem"]
            )
        )


@pytest.mark.parametrize("max_age", ["9" * 400 + "d", "0s", "36501d"])
def test_max_age_is_bounded(tmp_path: Path, key_dir: Path, max_age: str) -> None:
    """Old code: 400 nines parsed as float inf, so no gate was ever stale; 0s made every gate stale."""
    with pytest.raises(PolicyError, match="maxAge must be more than 0s and at most 36500d"):
        PolicySet.from_file(
            write_policy_file(
                tmp_path / "policy.yaml",
                match="file:///models/*",
                keys=[key_dir / "ecdsa-p256.pub.pem"],
                attestations={"robustness": {"maxAge": max_age}},
            )
        )


def _server(tmp_path: Path, **fields: Any) -> Path:
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ServerConfig",
        "dataDir": "data",
        "policy": "policy.yaml",
        **fields,
    }
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:50051", "[::]:50051", "192.168.1.10:50051", "[fe80::1]:1", "modelsec.internal:50051"]
)
def test_tokens_on_a_plaintext_network_listener_are_refused(tmp_path: Path, listen: str) -> None:
    """Old code: accepted, and served bearer tokens in the clear on every interface."""
    with pytest.raises(PolicyError, match=f"bearer tokens over plaintext on {listen.replace('[', '.')}"):
        load_server_config(_server(tmp_path, listen=listen, tokens=[TOKEN]))


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.8.9.10:50051", "[::1]:0", "localhost:50051"])
def test_tokens_on_plaintext_loopback_stay_allowed(tmp_path: Path, listen: str) -> None:
    assert load_server_config(_server(tmp_path, listen=listen, tokens=[TOKEN])).tokens


def test_tokens_with_tls_on_any_address_are_allowed(tmp_path: Path) -> None:
    config = load_server_config(
        _server(tmp_path, listen="0.0.0.0:50051", tokens=[TOKEN], tls={"cert": "s.pem", "key": "s.key"})
    )
    assert config.tls is not None and config.tokens


def test_anonymous_callers_only_on_loopback(tmp_path: Path) -> None:
    """User trial 2: `allowAnonymous` on 0.0.0.0 answered VerifyModel for any host that reached it."""
    assert load_server_config(
        _server(tmp_path, listen="127.0.0.1:50051", allowAnonymous=True)
    ).allow_anonymous
    for listen in ("0.0.0.0:50051", "[::]:50051", "192.0.2.2:50051", "models.internal:50051"):
        with pytest.raises(PolicyError, match=f"allowAnonymous on {re.escape(listen)}: any host"):
            load_server_config(_server(tmp_path, listen=listen, allowAnonymous=True))
    config = load_server_config(_server(tmp_path, listen="127.0.0.1:0", allowAnonymous=True))
    with pytest.raises(PolicyError, match=r"allowAnonymous on 0\.0\.0\.0:0"):
        config.replace(listen="0.0.0.0:0")  # `serve --listen`


def test_a_listen_override_is_checked_too(tmp_path: Path) -> None:
    """`modelsec serve --listen` replaces the address with `ServerConfig.replace`: the check runs again."""
    config = load_server_config(_server(tmp_path, listen="127.0.0.1:0", tokens=[TOKEN]))
    with pytest.raises(PolicyError, match="bearer tokens over plaintext"):
        config.replace(listen="0.0.0.0:0")


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("[::1]:1", True),
        ("localhost:1", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
    ],
)
def test_is_loopback_listen(listen: str, loopback: bool) -> None:
    assert is_loopback_listen(listen) is loopback
