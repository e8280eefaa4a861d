"""Acceptance corpus, loader stage: load_model, open_model and the installed hooks refuse every loader case
with a specific VerificationError and build zero tensors; BASE00 loads with the expected dtypes and shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import VerificationError
from modelsec.policy import Policy
from modelsec.verifier import _shard_buffers, load_model, open_model
from modelsec.verifier.guard import hook
from tests.conftest import CORPUS
from tests.corpus._cases import case_ids, expected, materialise, mentions_all

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus not present")
MARKERS = [Path(f"/tmp/modelsec_marker_{c}") for c in ("PKL01", "PKL03", "RC01", "MAN04")]


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of every tensor the loader builds (must stay empty for refused inputs)."""
    names: list[str] = []
    original = _shard_buffers.tensor_from

    def counting(*args: Any) -> Any:
        names.append(args[3])
        return original(*args)

    monkeypatch.setattr(_shard_buffers, "tensor_from", counting)
    for m in MARKERS:
        m.unlink(missing_ok=True)
    yield names
    assert not [m for m in MARKERS if m.exists()], "a payload ran"


@pytest.fixture
def hooked() -> Iterator[Callable[[Policy], None]]:
    yield hook.install
    hook.uninstall()


def _entry_points(
    target: Path, policy: Policy, install: Callable[[Policy], None]
) -> list[Callable[[], object]]:
    """Every way a node could load `target`: the API, the lazy reader, and the hooked libraries."""

    def via_load_file() -> object:
        import safetensors.torch

        install(policy)
        shards = [target] if target.is_file() else sorted(target.glob("*.safetensors"))
        if target.is_dir():
            hook.preflight(target, policy)
        return [safetensors.torch.load_file(str(s)) for s in shards]

    def via_safe_open() -> object:
        import safetensors

        install(policy)
        shards = [target] if target.is_file() else sorted(target.glob("*.safetensors"))
        if target.is_dir():
            hook.preflight(target, policy)
        out = []
        for s in shards:
            with safetensors.safe_open(str(s), framework="pt") as f:
                out += [f.get_tensor(k) for k in f.keys()]
        return out

    return [
        lambda: load_model(target, policy),
        lambda: [open_model(target, policy).get_tensor(k) for k in open_model(target, policy).keys()],
        via_load_file,
        via_safe_open,
    ]


def _refused_everywhere(
    target: Path, policy: Policy, built: list[str], hooked: Any, mentions: list[str]
) -> None:
    for i, entry in enumerate(_entry_points(target, policy, hooked)):
        with pytest.raises(VerificationError) as info:
            entry()
        hook.uninstall()
        assert mentions_all(info.value.diagnostics(), mentions), (i, info.value.diagnostics())
    assert built == []


def test_base00_loads_expected_tensors(tmp_path: Path, built: list[str], hooked: Any) -> None:
    d = materialise("BASE00-valid-control", tmp_path)
    policy = Policy.from_key_files([d / "trust/trusted-p256.pub.pem"])
    tensors = load_model(d / "model", policy)
    assert len(tensors) == expected("BASE00-valid-control")["tensors"]
    assert {str(t.dtype) for t in tensors.values()} == {"torch.float32", "torch.bfloat16", "torch.float16"}
    assert all(tuple(t.shape) == (4, 4) for t in tensors.values())
    hooked(policy)
    import safetensors.torch

    via_hook: dict[str, Any] = {}
    for shard in sorted((d / "model").glob("*.safetensors")):
        via_hook.update(safetensors.torch.load_file(str(shard)))
    assert via_hook.keys() == tensors.keys()
    assert all(torch.equal(via_hook[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("case", case_ids(("ST",)))
def test_safetensors_cases_load_nothing(case: str, tmp_path: Path, built: list[str], hooked: Any) -> None:
    d = materialise(case, tmp_path)
    policy = Policy.from_key_files([d / "trust/trusted-p256.pub.pem"])
    mentions = expected(case).get("error_mentions", [])
    for target in expected(case)["applies_to"]:
        _refused_everywhere(d / target.rstrip("/"), policy, built, hooked, mentions)


@pytest.mark.parametrize(
    ("case", "targets", "mentions"),
    [
        ("PKL01-pickle-checkpoint-runs-code", ["pytorch_model.bin", "model.pkl", "signed"], ["pickle"]),
        ("PKL03-pickle-named-safetensors", ["model.safetensors", "raw_pickle.safetensors"], ["header"]),
        ("RC01-config-auto-map-code", ["model_signed_code", "model_unsigned_code"], []),
        (
            "MAN02-symlinks-in-model-dir",
            ["model_file_link", "model_abs_link", "model_dir_link", "model_signed_allow"],
            ["symlink"],
        ),
        ("MAN03-symlink-cycle", ["model"], ["symlink"]),
        ("SIG01-ecdsa-psychic-zero", ["model"], ["signature"]),
        ("SIG02-ecdsa-r-s-out-of-range", ["model"], ["signature"]),
    ],
)
def test_refusal_cases_load_nothing(
    case: str, targets: list[str], mentions: list[str], tmp_path: Path, built: list[str], hooked: Any
) -> None:
    d = materialise(case, tmp_path)
    key = d / "trust/trusted-p256.pub.pem"
    if not key.exists():
        key = CORPUS / "BASE00-valid-control/trust/trusted-p256.pub.pem"
    policy = Policy.from_key_files([key])
    for target in targets:
        _refused_everywhere(d / target, policy, built, hooked, mentions)


def test_man04_loader(tmp_path: Path, built: list[str]) -> None:
    case = "MAN04-added-removed-renamed-files"
    d = materialise(case, tmp_path)
    policy = Policy.from_key_files([d / "trust/trusted-p256.pub.pem"])
    for directory, verdict in expected(case)["directories"].items():
        if verdict == "accept":
            assert load_model(d / directory, policy, bundles=[d / "model.sig"])
        else:
            with pytest.raises(VerificationError):
                load_model(d / directory, policy, bundles=[d / "model.sig"])
