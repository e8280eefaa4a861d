"""Fuzz targets, one per parser of untrusted or operator input (issue 14), run in CI with hypothesis.

Each target feeds random and mutated inputs to one parser and asserts that it either returns or raises a
`modelsec.errors.Error`, never another exception. Each is bounded (max_examples, no deadline) to stay
under 10 seconds; run longer locally with a larger `MODELSEC_FUZZ_EXAMPLES`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelsec.attestations.bundle import parse_bundle
from modelsec.attestations.statement import parse_statement
from modelsec.errors import Error
from modelsec.limits import Limits
from modelsec.modelformat.safetensors_header import parse_header
from modelsec.policy import PolicySet
from modelsec.service.config import load_server_config

EXAMPLES = int(os.environ.get("MODELSEC_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.sampled_from([10**400, 2**64, -(2**63) - 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for pos, byte in edits:
        if out:
            out[pos % len(out)] = byte
    return bytes(out)


EDITS = st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(0, 255)), max_size=6)


def _accepts_or_modelsec_error(call: Any) -> None:
    try:
        call()
    except Error:
        pass


# --- safetensors header ---------------------------------------------------------------------------------

_HEADER = json.dumps(
    {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]},
    }
).encode()


@FUZZ
@given(edits=EDITS, tail=st.binary(max_size=32), value=JSON)
def test_fuzz_safetensors_header(edits: list[tuple[int, int]], tail: bytes, value: object) -> None:
    limits = Limits(max_safetensors_header_bytes=4096)
    for header in (_mutate(_HEADER, edits), _HEADER[: len(_HEADER) // 2] + tail, json.dumps(value).encode()):
        _accepts_or_modelsec_error(lambda h=header: parse_header(h, 8 + len(h) + 20, path="f", limits=limits))


# --- bundle JSON ----------------------------------------------------------------------------------------

_BUNDLE = json.dumps(
    {
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": "ab" * 32}},
        "dsseEnvelope": {
            "payload": "eyJhIjoxfQ==",
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{"sig": "MEUCIQ==", "keyid": ""}],
        },
    }
).encode()


@FUZZ
@given(edits=EDITS, value=JSON)
def test_fuzz_bundle_json(edits: list[tuple[int, int]], value: object) -> None:
    for data in (_mutate(_BUNDLE, edits), json.dumps(value).encode()):
        _accepts_or_modelsec_error(lambda d=data: parse_bundle(d, source="b"))


# --- in-toto statement ----------------------------------------------------------------------------------


@pytest.mark.slow
@FUZZ
@given(edits=EDITS, predicate=JSON, subject=JSON)
def test_fuzz_statement(edits: list[tuple[int, int]], predicate: object, subject: object) -> None:
    good = json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "m", "digest": {"sha256": "a" * 64}}],
            "predicateType": "https://modelsec.dev/robustness-gate/v1",
            "predicate": predicate if isinstance(predicate, dict) else {"p": predicate},
        }
    ).encode()
    odd = json.dumps({"_type": "https://in-toto.io/Statement/v1", "subject": subject}).encode()
    for data in (good, _mutate(good, edits), odd):
        _accepts_or_modelsec_error(lambda d=data: parse_statement(d, what="s"))


# --- policy YAML and server configuration ---------------------------------------------------------------

_POLICY = b"""apiVersion: modelsec.dev/v1alpha1
kind: ModelPolicy
policies:
  - name: p
    match: ["file:///models/**"]
    keys: [{path: k.pem, name: k, roles: [weights]}]
    limits: {maxFiles: 10, maxSafetensorsHeaderBytes: 1000}
    attestations:
      robustness: {minEps: 0.03, minRobustAccuracy: 0.9, maxAge: 30d}
      watermark: {required: true, minConfidence: 0.9}
"""

_SERVER = b"""apiVersion: modelsec.dev/v1alpha1
kind: ServerConfig
listen: 127.0.0.1:0
dataDir: data
policy: policy.yaml
tokens: [{identity: ci, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
keys: [{name: k, path: k.pem, roles: [gate], allow: ["*"]}]
access: {putAttestation: [ci]}
gracePeriod: 5
"""

# The policy names a real key, so mutations reach limits and attestations instead of stopping at the key.
_KEY_PEM = (
    ec.generate_private_key(ec.SECP256R1())
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
)


def _write_key(directory: Path) -> None:
    (directory / "k.pem").write_bytes(_KEY_PEM)


YAML_NOISE = st.sampled_from(
    [b"[", b"]", b"{", b"}", b"? ", b": ", b"- ", b"&a ", b"*a", b"!!python/object ", b"<<: ", b"\n", b"  ",
     b"'", b'"', b"#", b"1e400", b"9" * 40, b"~", b"\t", b"\x00", b"\xff", b"%YAML 1.1\n", b"---\n"]
)  # fmt: skip


def _yaml_inputs(base: bytes, edits: list[tuple[int, int]], inserts: list[tuple[int, bytes]]) -> list[bytes]:
    inserted = bytearray(base)
    for pos, chunk in inserts:
        at = pos % (len(inserted) + 1)
        inserted[at:at] = chunk
    return [_mutate(base, edits), bytes(inserted)]


@pytest.mark.slow
@FUZZ
@given(edits=EDITS, inserts=st.lists(st.tuples(st.integers(0, 10**4), YAML_NOISE), max_size=5))
def test_fuzz_policy_yaml(edits: list[tuple[int, int]], inserts: list[tuple[int, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        _write_key(Path(d))
        path = Path(d) / "policy.yaml"
        for data in _yaml_inputs(_POLICY, edits, inserts):
            path.write_bytes(data)
            _accepts_or_modelsec_error(lambda: PolicySet.from_file(path))


@pytest.mark.slow
@FUZZ
@given(edits=EDITS, inserts=st.lists(st.tuples(st.integers(0, 10**4), YAML_NOISE), max_size=5))
def test_fuzz_server_config(edits: list[tuple[int, int]], inserts: list[tuple[int, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "server.yaml"
        for data in _yaml_inputs(_SERVER, edits, inserts):
            path.write_bytes(data)
            _accepts_or_modelsec_error(lambda: load_server_config(path))


def test_seed_inputs_parse() -> None:
    """The seeds are valid, so the mutations start from the deep paths, not from an early refusal."""
    header = parse_header(_HEADER, 8 + len(_HEADER) + 20, path="f", limits=Limits())
    assert [t.name for t in header.tensors] == ["a", "b"]
    assert parse_bundle(_BUNDLE, source="b").envelope.payload == b'{"a":1}'
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "server.yaml").write_bytes(_SERVER)
        assert load_server_config(Path(d) / "server.yaml").tokens
    with tempfile.TemporaryDirectory() as d:
        _write_key(Path(d))
        (Path(d) / "policy.yaml").write_bytes(_POLICY)
        assert PolicySet.from_file(Path(d) / "policy.yaml").policies[0].limits.max_files == 10
