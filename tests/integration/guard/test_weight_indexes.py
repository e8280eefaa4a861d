"""Every weight index under the runtime guard, with real transformers loads (issue 27, item 1).

transformers loads a local sharded checkpoint through `get_checkpoint_shard_files`, which joins each
`weight_map` value onto the folder (an absolute value replaces it) without passing through `cached_files`.
Three signed models that verified before: (a) `pytorch_model.bin.index.json` naming an absolute pickle
outside the model, whose unpickling would create a marker file; (b)
`text_encoder/model.safetensors.index.json`
naming another signed model's shard; (c) the same through `model.safetensors.index.fp16.json` and
`variant="fp16"`. Each is refused when the model is verified, with `MalformedArtifactError` naming the
index and the entry, before any shard is read. The cases live in `_index_cases.py`: they run here in-process
under the pinned transformers (5.24, which does not check the names itself) and, in one slow test, in a child
process under transformers 5.25 (which does), with the guard installed by `$MODELSEC_POLICY` as in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import MalformedArtifactError
from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.guard import hook
from tests.integration._transformers_overlay import OverlayUnavailable, path_for
from tests.integration.guard import _index_cases as cases

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ATTACKS = {
    "pickle_absolute": ("pytorch_model.bin.index.json", "is absolute"),
    "subfolder_other": ("text_encoder/model.safetensors.index.json", "is absolute"),
    "variant_other": ("text_encoder/model.safetensors.index.fp16.json", "is absolute"),
}
NEWER = "5.25.0"  # refuses shard names outside the model folder itself


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker").resolve() / "unpickled"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, key_dir: Path, marker: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    signer = load_private_key_file(key_dir / "ecdsa-p256.key.pem")
    root = tmp_path_factory.mktemp("indexes").resolve()
    return cases.write_models(root, lambda d: sign_model(d, [signer]), marker)


@pytest.fixture(scope="module")
def policy(key_dir: Path) -> Policy:
    return Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])


@pytest.fixture
def guard(policy: Policy) -> Iterator[None]:
    hook.install(policy)
    yield
    hook.uninstall()


def _assert_refused(got: dict[str, Any], case: str, models: dict[str, Any], marker: Path) -> None:
    index, why = ATTACKS[case]
    assert "value" not in got, f"{case} loaded (checksum {got['value']!r}; the other model's is "
    f"{models['checksums']['other']!r})"
    assert got["error"] == "modelsec.errors.MalformedArtifactError", got
    model = Path(models[case])
    assert f"{model}/{index}: weight_map[`" in got["message"], got["message"]
    assert why in got["message"] and "inside the index's folder" in got["message"]
    assert not marker.exists(), "the unverified pickle was unpickled"


@pytest.mark.parametrize("case", ATTACKS)
def test_an_index_naming_a_file_outside_its_folder_is_refused_under_the_guard(
    models: dict[str, Any], marker: Path, guard: None, case: str
) -> None:
    _assert_refused(cases.run_case(case, models), case, models, marker)


@pytest.mark.parametrize("case", ATTACKS)
def test_verify_refuses_the_same_models(
    models: dict[str, Any], policy: Policy, marker: Path, case: str
) -> None:
    with pytest.raises(MalformedArtifactError) as refused:
        verify_model(Path(models[case]), policy)
    _assert_refused(
        {"error": "modelsec.errors.MalformedArtifactError", "message": str(refused.value)},
        case,
        models,
        marker,
    )


@pytest.mark.parametrize(("case", "checksum"), [("good", "good"), ("good_variant", "good_variant")])
def test_a_subfolder_index_naming_its_own_shards_loads_the_signed_weights(
    models: dict[str, Any], guard: None, case: str, checksum: str
) -> None:
    assert cases.run_case(case, models) == {"value": models["checksums"][checksum]}


def _assert_served_from_snapshot(got: dict[str, Any], models: dict[str, Any]) -> None:
    shards = got.get("value")
    assert isinstance(shards, list) and len(shards) == 1, got
    assert shards[0].endswith(f"/good/text_encoder/{cases.SHARD}")
    assert not shards[0].startswith(models["good"] + "/"), "a shard path into the unverified directory"


def test_shard_resolution_serves_the_verified_snapshot(models: dict[str, Any], guard: None) -> None:
    got = cases.run_case("shard_files_direct", models)
    _assert_served_from_snapshot(got, models)
    from modelsec.verifier.guard.snapshot import snapshot_containing

    hit = snapshot_containing(got["value"][0])
    assert hit is not None and hit[0].source == Path(models["good"])


@pytest.mark.slow  # installs transformers 5.25 once per machine, then one child process (~10 s)
def test_the_guard_holds_under_transformers_5_25(
    models: dict[str, Any], key_dir: Path, marker: Path, tmp_path: Path
) -> None:
    try:
        overlay = path_for(NEWER)
    except OverlayUnavailable as e:
        pytest.skip(str(e))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: test\n    match: ['file://{models['models']}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
    )
    described = tmp_path / "models.json"
    described.write_text(json.dumps(models))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}
    env.update(MODELSEC_POLICY=str(policy), HF_HUB_OFFLINE="1", PYTHONPATH=str(overlay))
    out = subprocess.run(
        [sys.executable, cases.__file__, str(described)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["transformers"] == NEWER
    results = report["results"]
    for case in ATTACKS:
        _assert_refused(results[case], case, models, marker)
    assert results["good"] == {"value": models["checksums"]["good"]}
    assert results["good_variant"] == {"value": models["checksums"]["good_variant"]}
    _assert_served_from_snapshot(results["shard_files_direct"], models)


def test_shard_resolution_refuses_shards_outside_the_indexs_snapshot(
    models: dict[str, Any], guard: None
) -> None:
    from transformers.utils.hub import get_checkpoint_shard_files

    from modelsec.errors import PolicyViolationError

    other_index = os.path.join(models["other"], cases.INDEX)
    with pytest.raises(PolicyViolationError) as refused:
        get_checkpoint_shard_files(models["good"], other_index)  # another model's index onto this folder
    assert f"{models['other']}/{cases.INDEX}: names the shard" in str(refused.value)
    assert "is not a signed file of" in str(refused.value)
