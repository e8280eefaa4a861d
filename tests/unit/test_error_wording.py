"""One wording test per `modelsec.errors` class (issue 31).

Each error is one line that names the thing at fault (file, tensor, field, registry, server, key) and, where
there is one, what to do next; the detail (a third-party error's text, each key's reason) is behind
`modelsec --verbose` and in `--json`'s `error.details`.

A table, one row per public class: the error is triggered through the public API where that is cheap (a real
model, real keys), else built as its raise site builds it (the site is named). The table must cover every
class in `modelsec.errors.__all__`, so a new class needs a row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from modelsec import errors
from modelsec.cli.common import fail, json_option
from modelsec.cli.main import main


@dataclass(frozen=True)
class Row:
    """`make(tmp, key_dir)` gives the error; `names`: what its line names; `next_step`: what it says to do."""

    make: Callable[[Path, Path], errors.Error]
    names: tuple[str, ...]
    next_step: str | None = None
    details: bool = False  # whether the error carries detail lines (shown by --verbose)


def _raised(f: Callable[[], object]) -> errors.Error:
    try:
        f()
    except errors.Error as e:
        return e
    raise AssertionError("no modelsec error raised")


def _model(tmp: Path, key_dir: Path, *, signed: bool = True) -> Path:
    from modelsec.signer import load_private_key_file, sign_model
    from tests.conftest import write_tiny_model

    model = write_tiny_model(tmp / "model", seed=7)
    if signed:
        sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return model


def _policy(key_dir: Path, name: str = "ecdsa-p256.pub.pem") -> object:
    from modelsec.policy import Policy

    return Policy.from_key_files([key_dir / name])


def _verify(
    tmp: Path, key_dir: Path, change: Callable[[Path], object], key: str = "ecdsa-p256.pub.pem"
) -> errors.Error:
    from modelsec.verifier import verify_model

    model = _model(tmp, key_dir)
    change(model)
    return _raised(lambda: verify_model(model, _policy(key_dir, key)))  # type: ignore[arg-type]


def _tamper(model: Path) -> None:
    shard = sorted(model.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))


def _bad_header(tmp: Path, key_dir: Path) -> errors.Error:
    from modelsec.signer import load_private_key_file, sign_model

    (tmp / "bad").mkdir()
    (tmp / "bad" / "model.safetensors").write_bytes(b"\xff" * 16)
    return _raised(lambda: sign_model(tmp / "bad", [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]))


def _sign_again(tmp: Path, key_dir: Path) -> errors.Error:
    from modelsec.signer import load_private_key_file, sign_model

    model = _model(tmp, key_dir)
    return _raised(lambda: sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")]))


def _bad_pem(tmp: Path, key_dir: Path) -> errors.Error:
    from modelsec.policy import Policy

    pem = tmp / "broken.pub.pem"
    pem.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    return _raised(lambda: Policy.from_key_files([pem]))


def _bad_policy(tmp: Path, key_dir: Path) -> errors.Error:
    from modelsec.policy import PolicySet

    path = tmp / "policy.yaml"
    path.write_text("apiVersion: nope\n")
    return _raised(lambda: PolicySet.from_file(path))


def _bad_reference(tmp: Path, key_dir: Path) -> errors.Error:
    from modelsec.registry.client import parse_reference

    return _raised(lambda: parse_reference("oci://registry.example/Models/x:v1"))


ROWS: dict[type[errors.Error], Row] = {
    # core/service/client.py: a status code without modelsec details (another server, a proxy).
    errors.Error: Row(
        lambda t, k: errors.Error("SignStatement: RESOURCE_EXHAUSTED: store slot full"), ("SignStatement",)
    ),
    errors.VerificationError: Row(
        lambda t, k: errors.VerificationError("VerifyModel: FAILED_PRECONDITION: /models/m: refused"),
        ("/models/m",),
    ),
    errors.DigestMismatchError: Row(
        lambda t, k: _verify(t, k, _tamper), (".safetensors", "expected sha256 digest")
    ),
    errors.FileSetMismatchError: Row(
        lambda t, k: _verify(t, k, lambda m: (m / "extra.bin").write_bytes(b"x")), ("model", "extra.bin")
    ),
    errors.SignatureError: Row(
        lambda t, k: _verify(t, k, lambda m: [p.unlink() for p in m.glob("*.sig")]), ("model", "model.sig")
    ),
    errors.UntrustedSignerError: Row(
        lambda t, k: _verify(t, k, lambda m: None, key="other.pub.pem"),
        ("model.sig", "key id", "other.pub.pem"),
        "--trusted-key",
        details=True,
    ),
    # verifier/stores: a store that holds no such model.
    errors.AttestationError: Row(
        lambda t, k: errors.AttestationError(
            f"oci://r/m: no model with root digest {'ab' * 32} (push the model first)"
        ),
        ("oci://r/m", "ab" * 32),
        "push the model first",
    ),
    errors.ReceiptError: Row(
        lambda t, k: errors.ReceiptError("node-a.receipt", "stale", "older than the policy's maxAge (300 s)"),
        ("node-a.receipt", "maxAge"),
    ),
    errors.MalformedArtifactError: Row(
        _bad_header, ("model.safetensors", "header length"), "maxSafetensorsHeaderBytes"
    ),
    errors.InvalidReferenceError: Row(_bad_reference, ("Models/x", "lower case")),
    # modelformat/model_files.py: the model directory is a symlink.
    errors.PolicyViolationError: Row(
        lambda t, k: errors.PolicyViolationError(
            "/models/m: the model directory is a symlink; give its real path"
        ),
        ("/models/m",),
        "give its real path",
    ),
    errors.ModelMovedError: Row(
        lambda t, k: errors.ModelMovedError("/models/m", "the path now names another directory"),
        ("/models/m",),
    ),
    errors.PickleContentError: Row(
        lambda t, k: errors.PickleContentError("m/pytorch_model.bin", "a pickle (protocol 4)"),
        ("m/pytorch_model.bin", "pickle (protocol 4)"),
        "convert the weights to safetensors",
    ),
    errors.PolicyError: Row(_bad_policy, ("policy.yaml", "apiVersion")),
    errors.BundleExistsError: Row(_sign_again, ("model.sig",), "--force"),
    errors.KeyMaterialError: Row(_bad_pem, ("broken.pub.pem",), "SubjectPublicKeyInfo PEM", details=True),
    # signer/schemes/sm2: a key of another curve given as SM2.
    errors.UnsupportedAlgorithmError: Row(
        lambda t, k: errors.UnsupportedAlgorithmError(
            "ci.pub.pem: not an SM2 key (id-ecPublicKey + sm2p256v1)"
        ),
        ("ci.pub.pem", "SM2"),
    ),
    # robustness/gate: the verdict with its reasons.
    errors.GateFailedError: Row(
        lambda t, k: errors.GateFailedError(
            "PGD robustness gate FAILED: robust accuracy 0.81 < minRobustAccuracy 0.9"
        ),
        ("robust accuracy", "minRobustAccuracy"),
    ),
    errors.BackendUnavailableError: Row(
        lambda t, k: errors.BackendUnavailableError("registry r.example: token request failed"),
        ("r.example",),
    ),
    errors.RegistryUnreachableError: Row(
        lambda t, k: errors.RegistryUnreachableError(
            "r.example:5000", "plain-http-server", "GET https://…: SSLError"
        ),
        ("r.example:5000",),
        "--plain-http",
        details=True,
    ),
    errors.ServerUnreachableError: Row(
        lambda t, k: errors.ServerUnreachableError(
            "signer:50051", "plaintext-server", "ListKeys: UNAVAILABLE: …"
        ),
        ("signer:50051",),
        "--plaintext",
        details=True,
    ),
    errors.AuthenticationError: Row(
        lambda t, k: errors.AuthenticationError("unknown bearer token"), ("bearer token",)
    ),
    errors.PermissionDeniedError: Row(
        lambda t, k: errors.PermissionDeniedError("path must be an absolute path on the server, got 'm'"),
        ("'m'",),
    ),
    errors.NotFoundError: Row(
        lambda t, k: errors.NotFoundError("policy 'prod' is not defined in /etc/modelsec/policy.yaml"),
        ("'prod'", "policy.yaml"),
    ),
}


def test_the_table_covers_every_public_error_class() -> None:
    public = {getattr(errors, name) for name in errors.__all__}
    assert set(ROWS) == public


@pytest.fixture
def raise_command() -> Iterator[list[errors.Error]]:
    """A `modelsec _raise` command failing with the error put in the list (the real root, its --verbose)."""
    box: list[errors.Error] = []

    @click.command(name="_raise", hidden=True)
    @json_option
    def _raise(as_json: bool) -> None:
        fail(box[0], as_json)

    main.add_command(_raise)
    try:
        yield box
    finally:
        main.commands.pop("_raise")


@pytest.mark.parametrize("cls", list(ROWS), ids=lambda c: c.__name__)
def test_wording(
    cls: type[errors.Error], tmp_path: Path, key_dir: Path, raise_command: list[errors.Error], cli
) -> None:  # type: ignore[no-untyped-def]
    row = ROWS[cls]
    error = row.make(tmp_path, key_dir)
    assert type(error) is cls, repr(error)
    line = error.diagnostics()
    assert "\n" not in line and len(line) < 400 + len(str(tmp_path)) * 2, line
    for thing in row.names:
        assert thing in line, (thing, line)
    if row.next_step is not None:
        assert row.next_step in line, line
    assert bool(error.details) is row.details, error.details

    raise_command.append(error)
    env = {"NO_COLOR": "1"}
    plain = cli("_raise", env=env)
    assert plain.returncode == 1 and plain.stderr == f"modelsec: error: {line}\n"
    verbose = cli("--verbose", "_raise", env=env)
    assert verbose.stderr.splitlines() == [f"modelsec: error: {line}", *(f"  {d}" for d in error.details)]
    doc = json.loads(cli("_raise", "--json", env=env).stdout)["error"]
    assert doc["kind"] == cls.__name__ and doc["message"] == line
    assert doc.get("details", []) == list(error.details)
    assert os.linesep not in doc["message"]


def test_a_private_subclass_is_reported_as_its_public_class(raise_command: list[errors.Error], cli) -> None:  # type: ignore[no-untyped-def]
    class _Lost(errors.RegistryUnreachableError):
        pass

    raise_command.append(_Lost("r.example", "connection", "reset"))
    doc = json.loads(cli("_raise", "--json").stdout)["error"]
    assert doc["kind"] == "RegistryUnreachableError"
