"""The loader reads `$MODELSEC_MODEL_DIGEST` as `modelsec verify` and the runtime guard read it.

A pod gets the admission annotation (or a bare `sha256:<hex>`) through that variable; `load_model`,
`load_signed_model` and `open_model` must refuse a model whose signed root digest it does not pin, and a
malformed value, before any model file is opened. An `expected_digests` argument pins as well: it only
tightens the variable, and two pins with no digest in common are refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import DigestMismatchError, PolicyError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import load_model, load_signed_model, open_model

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

ENV = "MODELSEC_MODEL_DIGEST"
A, B = "a" * 64, "b" * 64
_opened: list[str] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _opened is not None and event == "open" and args and isinstance(args[0], str):
        _opened.append(args[0])


sys.addaudithook(_audit)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The paths opened while the test runs (`open` audit events: `open()` and `os.open`)."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.fixture
def signed(tiny_model: Path, key_dir: Path) -> tuple[Path, Policy, str]:
    result = sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    return tiny_model, Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"]), result.root_digest


def _loaders(model: Path, policy: Policy) -> list[tuple[str, Callable[..., Any]]]:
    shard = model / "model-00001-of-00002.safetensors"
    return [
        ("load_model", lambda **kw: load_model(model, policy, **kw)),
        ("load_model(shard)", lambda **kw: load_model(shard, policy, **kw)),
        ("load_model(tensors)", lambda **kw: load_model(model, policy, tensors=["layers.1.weight"], **kw)),
        ("load_signed_model", lambda **kw: load_signed_model(model, policy, **kw).tensors),
        ("open_model", lambda **kw: open_model(model, policy, **kw).keys()),
    ]


def _reference(model: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(model.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _weights_opened(opened: list[str]) -> list[str]:
    return [p for p in opened if p.endswith(".safetensors")]


def test_variable_pins_the_root_before_any_weight_is_read(
    signed: tuple[Path, Policy, str], monkeypatch: pytest.MonkeyPatch, opened: list[str]
) -> None:
    model, policy, root = signed
    uri = "file://" + os.path.realpath(model)
    refused = [
        f"sha256:{A}",
        f"oci://r.io/m@sha256:{root}, {uri}@sha256:{A}",  # the entry naming this model decides
    ]
    for value in refused:
        monkeypatch.setenv(ENV, value)
        for name, load in _loaders(model, policy):
            opened.clear()
            with pytest.raises(DigestMismatchError) as e:
                load()
            assert e.value.expected == f"sha256:{A}", name
            assert e.value.actual == f"sha256:{root}", name
            assert "pinned" in e.value.path and str(model) in e.value.path, name
            assert _weights_opened(opened) == [], name
    # The pinned root loads, the same tensors as without modelsec.
    for value in (f"sha256:{root}", f"{uri}@sha256:{root},oci://r.io/m@sha256:{A}"):
        monkeypatch.setenv(ENV, value)
        for name, load in _loaders(model, policy):
            assert load(), name
        got = load_model(model, policy)
        assert got.keys() == _reference(model).keys()
        assert all(torch.equal(got[k], v) for k, v in _reference(model).items())


@pytest.mark.parametrize("value", ["", A, f"sha256:{A.upper()}", f"sha256:{A}0", "oci://r.io/m"])
def test_malformed_variable_refused_before_anything_is_read(
    signed: tuple[Path, Policy, str], monkeypatch: pytest.MonkeyPatch, opened: list[str], value: str
) -> None:
    model, policy, _ = signed
    monkeypatch.setenv(ENV, value)
    for name, load in _loaders(model, policy):
        opened.clear()
        with pytest.raises(PolicyError, match=ENV):
            load()
        assert [p for p in opened if p.startswith(str(model))] == [], name


def test_argument_and_variable_both_pin(
    signed: tuple[Path, Policy, str], monkeypatch: pytest.MonkeyPatch, opened: list[str]
) -> None:
    model, policy, root = signed
    monkeypatch.setenv(ENV, f"sha256:{root}")
    # An argument that agrees with the variable (one digest in common) loads.
    for name, load in _loaders(model, policy):
        assert load(expected_digests=[f"sha256:{A}", root]), name
    # An argument never replaces the variable: pins with nothing in common are refused, nothing is read.
    for env, arg in ((f"sha256:{root}", [f"sha256:{A}"]), (f"sha256:{A}", [f"sha256:{root}"])):
        monkeypatch.setenv(ENV, env)
        for name, load in _loaders(model, policy):
            opened.clear()
            with pytest.raises(PolicyError, match="no digest in common") as e:
                load(expected_digests=arg)
            assert ENV in str(e.value) and "expected_digests" in str(e.value), name
            assert [p for p in opened if p.startswith(str(model))] == [], name
    # Both given, the root is in both but another digest only in one: the intersection still holds it.
    monkeypatch.setenv(ENV, f"oci://r.io/m@sha256:{B},oci://r.io/n@sha256:{root}")
    for name, load in _loaders(model, policy):
        assert load(expected_digests=[root, A]), name
        with pytest.raises(DigestMismatchError):
            load(expected_digests=[B])
