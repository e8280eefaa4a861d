"""Policies over the session's test keys (`key_dir`: `<algorithm>.pub.pem`), one helper per shape.

- `key_policy`: a `Policy` trusting some test keys, as `--key` builds it.
- `policy_doc` / `policy_entry`: a ModelPolicy document, as a policy file holds it.
- `write_policy_doc`: that document written as a file; `write_policy_file`: one entry written as a file;
  `first_policy`: a document parsed back to its first `Policy`.
- `write_policy`: the default policy file of the gRPC server (P-256 and SM2 keys for every role).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modelsec.algorithms import SignatureAlgorithm
from modelsec.policy import Policy, PolicySet

API_VERSION = "modelsec.dev/v1alpha1"


def key_policy(key_dir: Path, *algorithms: SignatureAlgorithm | str, **options: Any) -> Policy:
    """`Policy.from_key_files` over the test keys of `algorithms` (default: P-256); `options` as it takes them
    (`require=`, `allow_remote_code=`, `limits=`)."""
    names = [a.value if isinstance(a, SignatureAlgorithm) else a for a in algorithms] or ["ecdsa-p256"]
    return Policy.from_key_files([key_dir / f"{name}.pub.pem" for name in names], **options)


def policy_entry(
    *,
    name: str = "p",
    match: str | list[str] = "file:///**",
    keys: Sequence[str | Path | Mapping[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One entry of a ModelPolicy's `policies`: `keys` as paths or key entries, camelCase `fields` as is."""
    entry: dict[str, Any] = {"name": name, "match": [match] if isinstance(match, str) else list(match)}
    if keys is not None:
        entry["keys"] = [str(k) if isinstance(k, Path) else k for k in keys]
    entry.update(fields)
    return entry


def policy_doc(*entries: Mapping[str, Any]) -> dict[str, Any]:
    """A ModelPolicy document holding `entries` (default: one `policy_entry()`)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelPolicy",
        "policies": [dict(e) for e in entries or [policy_entry()]],
    }


def write_policy_doc(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write `doc` as JSON (which is YAML) to `path`; a directory gets the next free `policy-N.json` in it."""
    if path.is_dir():
        path = path / f"policy-{len(list(path.glob('policy-*')))}.json"
    path.write_text(json.dumps(doc, default=lambda t: t.isoformat()))
    return path


def write_policy_file(path: Path, **entry: Any) -> Path:
    """A policy file holding one `policy_entry(**entry)` (see `write_policy_doc` for `path`)."""
    return write_policy_doc(path, policy_doc(policy_entry(**entry)))


def first_policy(doc: Mapping[str, Any], base_dir: Path) -> Policy:
    """The first policy of `doc`, parsed as a policy file in `base_dir` would be."""
    return PolicySet.from_mapping(dict(doc), base_dir=base_dir, source="policy.yaml").policies[0]


def write_policy(directory: Path, key_dir: Path, *, match: str = "file:///**", extra: str = "") -> Path:
    """A ModelPolicy trusting the P-256 and SM2 test keys for every role (plus `extra` YAML lines)."""
    path = directory / "policy.yaml"
    path.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: default\n    match: [{json.dumps(match)}]\n"
        f"    keys: [{json.dumps(str(key_dir / 'ecdsa-p256.pub.pem'))}, "
        f"{json.dumps(str(key_dir / 'sm2.pub.pem'))}]\n" + extra
    )
    return path
