"""`subfolder=` and file names under the runtime guard (user trial 2, findings 1 and 8).

transformers joins `subfolder` and file names onto the verified tree with `os.path.join`: an absolute name
discards the tree and `..` climbs out of it, so both would read unverified files. The guard refuses them
before anything is read. One child interpreter (started with only `MODELSEC_POLICY`, as in production)
runs every case; each test checks one case's outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelsec.signer import load_private_key_file, sign_model
from tests.integration.guard.models import CHAT_TEMPLATE, write_tiny_decoder

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # one child process builds every case (~15 s)
pytest.importorskip("torch")
pytest.importorskip("transformers")

ATTACKER_TEMPLATE = '{{ "ATTACKER TEMPLATE" }}'
UP = "../" * 24  # from the private tree up to `/`, whatever its depth

# Each case: code evaluated in the child with `tiny`, `nested`, `tig`, `unsigned`, `gen` bound to paths.
CASES = {
    "config_absolute_subfolder": "AutoConfig.from_pretrained(tiny, subfolder=unsigned).hidden_act",
    "tokenizer_absolute_subfolder": "AutoTokenizer.from_pretrained(tiny, subfolder=unsigned).chat_template",
    "model_absolute_subfolder": (
        "len(AutoModelForCausalLM.from_pretrained(tiny, subfolder=unsigned).model.layers)"
    ),
    "generation_absolute_subfolder": "GenerationConfig.from_pretrained(nested, subfolder=gen).temperature",
    "generation_absolute_file_name": (
        "GenerationConfig.from_pretrained(tiny, gen + '/generation_config.json').temperature"
    ),
    "generation_absolute_file_keyword": (
        "GenerationConfig.from_pretrained(tiny, config_file_name=gen + '/generation_config.json').temperature"
    ),
    "generation_model_keyword": "GenerationConfig.from_pretrained(pretrained_model_name=gen).temperature",
    "cached_file_absolute_name": "cached_file(tiny, unsigned + '/tokenizer_config.json')",
    "cached_files_absolute_subfolder": "cached_files(tiny, ['tokenizer_config.json'], subfolder=unsigned)",
    "config_dotdot_subfolder": (
        f"AutoConfig.from_pretrained(tiny, subfolder={UP!r} + unsigned[1:]).hidden_act"
    ),
    "config_short_dotdot_subfolder": "AutoConfig.from_pretrained(tiny, subfolder='../tiny').hidden_act",
    "cached_file_dotdot_name": f"cached_file(tiny, {UP!r} + unsigned[1:] + '/tokenizer_config.json')",
    "pipeline_absolute_subfolder": (
        "pipeline('text-generation', model=tiny, model_kwargs={'subfolder': unsigned})"
        ".model.config.hidden_act"
    ),
    "nested_config": "AutoConfig.from_pretrained(nested, subfolder='sub').hidden_act",
    "nested_tokenizer": "AutoTokenizer.from_pretrained(nested, subfolder='sub').chat_template",
    "nested_generation": "GenerationConfig.from_pretrained(nested, subfolder='sub').max_new_tokens",
    "nested_model": "len(AutoModelForCausalLM.from_pretrained(nested, subfolder='sub/').model.layers)",
    "ignored_config": "AutoConfig.from_pretrained(tig).hidden_act",
    "ignored_directory": "AutoConfig.from_pretrained(tig + '/.git/evil').hidden_act",
}
CHILD = """
import json, sys
from transformers import (
    AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, pipeline
)
from transformers.utils import cached_file
from transformers.utils.hub import cached_files
import torch
torch.set_num_threads(1)
from modelsec.verifier.guard import hook
assert hook.installed()
tiny, nested, tig, unsigned, gen = sys.argv[1:6]
results = {}
for name, code in json.loads(sys.argv[6]).items():
    try:
        value = eval(code)
    except Exception as e:
        results[name] = {"error": type(e).__module__ + "." + type(e).__name__, "message": str(e)}
    else:
        results[name] = {"value": value if isinstance(value, (int, float, str)) else repr(value)}
print(json.dumps(results))
"""


def _sign(model_dir: Path, key_dir: Path, **options: Any) -> Path:
    sign_model(model_dir, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")], **options)
    return model_dir


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("names").resolve()
    models = root / "models"
    tiny = write_tiny_decoder(models / "tiny")
    nested = models / "nested"
    shutil.copytree(tiny, nested / "sub")
    (nested / "model_index.json").write_text('{"sub": ["transformers", "LlamaForCausalLM"]}')
    tig = models / "tig"
    shutil.copytree(tiny, tig)
    (tig / ".git").mkdir()
    shutil.copytree(tiny, tig / ".git" / "evil")
    _sign(tig, key_dir, ignore_paths=["config.json"])
    _sign(tiny, key_dir)
    _sign(nested, key_dir)
    # Outside every policy's match: a model that is not signed, with a changed config and chat template.
    unsigned = root / "unsigned_full"
    shutil.copytree(tiny, unsigned, ignore=shutil.ignore_patterns("*.sig"))
    config = json.loads((unsigned / "config.json").read_text())
    config["hidden_act"] = "relu"
    (unsigned / "config.json").write_text(json.dumps(config))
    (unsigned / "chat_template.jinja").write_text(ATTACKER_TEMPLATE)
    gen = root / "unsigned_gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text('{"temperature": 9.0, "do_sample": true}')
    policy = root / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: test\n    match: ['file://{models}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}
    env.update(MODELSEC_POLICY=str(policy), HF_HUB_OFFLINE="1")
    args = [str(p) for p in (tiny, nested, tig, unsigned, gen)]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args, json.dumps(CASES)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    parsed: dict[str, dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return parsed


REFUSED = {
    "config_absolute_subfolder": "subfolder=",
    "tokenizer_absolute_subfolder": "subfolder=",
    "model_absolute_subfolder": "subfolder=",
    "generation_absolute_subfolder": "subfolder=",
    "generation_absolute_file_name": "config_file_name=",
    "generation_absolute_file_keyword": "config_file_name=",
    "cached_file_absolute_name": "filename=",
    "cached_files_absolute_subfolder": "subfolder=",
    "config_dotdot_subfolder": "'..' segment",
    "config_short_dotdot_subfolder": "'..' segment",
    "cached_file_dotdot_name": "'..' segment",
    "pipeline_absolute_subfolder": "subfolder=",
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_name_that_leaves_the_signed_model_is_refused_before_reading(
    results: dict[str, dict[str, Any]], case: str
) -> None:
    got = results[case]
    assert "value" not in got, f"{CASES[case]} gave {got['value']!r}"
    assert got["error"] == "modelsec.errors.PolicyViolationError"
    assert REFUSED[case] in got["message"]
    assert "/models/tiny:" in got["message"] or "/models/nested:" in got["message"]  # the model given
    assert "is absolute" in got["message"] or "'..' segment" in got["message"]


def test_a_model_reference_by_keyword_is_guarded_too(results: dict[str, dict[str, Any]]) -> None:
    got = results["generation_model_keyword"]
    assert "value" not in got, f"unsigned generation config loaded: {got['value']!r}"
    assert got["error"] == "modelsec.errors.SignatureError"
    assert "unsigned_gen: no signature bundle" in got["message"]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("nested_config", "silu"),
        ("nested_tokenizer", CHAT_TEMPLATE),
        ("nested_generation", 8),
        ("nested_model", 2),
    ],
)
def test_a_relative_subfolder_of_a_signed_model_loads(
    results: dict[str, dict[str, Any]], case: str, expected: object
) -> None:
    assert results[case] == {"value": expected}


@pytest.mark.parametrize(
    ("case", "path"), [("ignored_config", "tig/config.json"), ("ignored_directory", "tig/.git/evil")]
)
def test_a_path_the_bundle_ignores_is_refused_by_name(
    results: dict[str, dict[str, Any]], case: str, path: str
) -> None:
    got = results[case]
    assert got.get("error") == "modelsec.errors.PolicyViolationError", got
    assert f"{path}: not signed" in got["message"]
    assert "/dev/shm" not in got["message"]
