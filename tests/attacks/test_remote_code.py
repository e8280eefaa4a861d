"""Remote code named by any signed JSON file, at any depth, is refused unless policy allows it (and signed).

Hugging Face loaders import `auto_map` targets from config.json, tokenizer_config.json,
preprocessor_config.json, processor_config.json, nested configs (`vision_config.auto_map`) and subfolder
configs (`text_encoder/config.json`); a cross-repository reference (`org/repo--module.Class`) fetches code
from the Hub. Each is checked by `verify_model` after the file's bytes matched the manifest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import MalformedArtifactError, PolicyViolationError
from modelsec.limits import Limits
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from modelsec.verifier.verification import check_remote_code, remote_code_references
from tests.support.policies import key_policy

P256 = SignatureAlgorithm.ECDSA_P256.value


def _sign(model: Path, key_dir: Path) -> None:
    sign_model(model, [load_private_key_file(key_dir / f"{P256}.key.pem")])


def _write(model: Path, name: str, doc: object) -> None:
    (model / name).parent.mkdir(parents=True, exist_ok=True)
    (model / name).write_text(json.dumps(doc))


# name, document, the field the refusal names (user trial finding 8: custom_pipelines was called auto_map)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "nested-vision-config": (
        "config.json",
        {"model_type": "x", "vision_config": {"auto_map": {"AutoModel": "m.V"}}},
        "vision_config.auto_map",
    ),
    "preprocessor": ("preprocessor_config.json", {"auto_map": {"AutoImageProcessor": "m.P"}}, "auto_map"),
    "subfolder": ("text_encoder/config.json", {"auto_map": {"AutoModel": "m.T"}}, "auto_map"),
    "list-in-array": (
        "processor_config.json",
        {"extra": [{"deep": {"auto_map": {"AutoProcessor": "m.Q"}}}]},
        "extra[0].deep.auto_map",
    ),
    "tokenizer-pair": (
        "tokenizer_config.json",
        {"auto_map": {"AutoTokenizer": ["m.Slow", None]}},
        "auto_map",
    ),
    # A case-insensitive file system (macOS, Windows) opens these for `preprocessor_config.json` and
    # `text_encoder/config.json`: the suffix's case does not make a file less JSON to a loader.
    "upper-case-suffix": (
        "PREPROCESSOR_CONFIG.JSON",
        {"auto_map": {"AutoImageProcessor": "m.U"}},
        "auto_map",
    ),
    "mixed-case-subfolder": ("text_encoder/Config.Json", {"auto_map": {"AutoModel": "m.W"}}, "auto_map"),
    "custom-pipeline": (
        "config.json",
        {"custom_pipelines": {"t": {"impl": "m.Pipe", "pt": ["AutoModel"]}}},
        "custom_pipelines.t.impl",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_code_reference_anywhere_refused_by_default(case: str, tiny_model: Path, key_dir: Path) -> None:
    name, doc, field = CASES[case]
    _write(tiny_model, name, doc)
    _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match=re.escape(f"{name}: {field} requires remote code (m.")):
        verify_model(tiny_model, key_policy(key_dir))


def test_escaped_key_is_still_auto_map(tiny_model: Path, key_dir: Path) -> None:
    (tiny_model / "config.json").write_text('{"model_type": "x", "auto\\u005fmap": {"AutoModel": "m.X"}}')
    _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match="auto_map"):
        verify_model(tiny_model, key_policy(key_dir))


def test_single_json_file_verify_checks_it(tiny_model: Path, key_dir: Path) -> None:
    _write(tiny_model, "preprocessor_config.json", {"auto_map": {"AutoImageProcessor": "m.P"}})
    _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match=r"preprocessor_config\.json"):
        verify_model(tiny_model / "preprocessor_config.json", key_policy(key_dir))


def test_allowed_remote_code_must_be_local_and_signed(tiny_model: Path, key_dir: Path) -> None:
    _write(tiny_model, "config.json", {"vision_config": {"auto_map": {"AutoModel": "modeling_v.V"}}})
    _write(tiny_model, "text_encoder/config.json", {"auto_map": {"AutoModel": "modeling_t.T"}})
    _write(tiny_model, "tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["tok.Slow", None]}})
    (tiny_model / "modeling_v.py").write_text("")
    (tiny_model / "text_encoder").mkdir(exist_ok=True)
    (tiny_model / "text_encoder" / "modeling_t.py").write_text("")
    (tiny_model / "tok.py").write_text("")
    _sign(tiny_model, key_dir)
    assert verify_model(tiny_model, key_policy(key_dir, allow_remote_code=True)).files == 10
    with pytest.raises(PolicyViolationError):
        verify_model(tiny_model, key_policy(key_dir))


def test_allowed_remote_code_refuses_unsigned_module(tiny_model: Path, key_dir: Path) -> None:
    # The module sits next to the repository root, not next to the subfolder config that names it.
    _write(tiny_model, "text_encoder/config.json", {"auto_map": {"AutoModel": "modeling_t.T"}})
    (tiny_model / "modeling_t.py").write_text("")
    _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match=r"'text_encoder/modeling_t\.py'.*not a signed file"):
        verify_model(tiny_model, key_policy(key_dir, allow_remote_code=True))


@pytest.mark.parametrize("ref", ["org/repo--modeling_x.X", "modeling_x--x.X", "other/modeling_x.X"])
def test_allowed_remote_code_refuses_cross_repo(ref: str, tiny_model: Path, key_dir: Path) -> None:
    _write(tiny_model, "config.json", {"auto_map": {"AutoConfig": ref}})
    (tiny_model / "modeling_x.py").write_text("")
    _sign(tiny_model, key_dir)
    with pytest.raises(PolicyViolationError, match="another repository"):
        verify_model(tiny_model, key_policy(key_dir, allow_remote_code=True))


@pytest.mark.parametrize("bad", [["x"], {"AutoModel": 3}, {"AutoModel": [3]}, "m.X"])
def test_malformed_auto_map_refused(bad: object) -> None:
    with pytest.raises(MalformedArtifactError, match="auto_map"):
        remote_code_references({"a": {"auto_map": bad}}, what="config.json")


def test_reference_helpers() -> None:
    doc = {"auto_map": {"A": "a.A", "T": [None, "pkg.b.Fast"]}, "text_config": {"auto_map": {"B": "c.B"}}}
    assert sorted(remote_code_references(doc)) == ["a.A", "c.B", "pkg.b.Fast"]
    check_remote_code("x/config.json", ["pkg.b.Fast"], {"x/pkg/b.py"}, allow_remote_code=True, model="m")
    with pytest.raises(MalformedArtifactError, match=r"not a module\.Class"):
        check_remote_code("config.json", ["a..b"], {"a.py"}, allow_remote_code=True, model="m")


def test_json_beyond_limit_refused_not_skipped(tiny_model: Path, key_dir: Path) -> None:
    _write(tiny_model, "extra_config.json", {"pad": "x" * 5000})
    _sign(tiny_model, key_dir)
    with pytest.raises(
        MalformedArtifactError, match=r"extra_config\.json.*4096 bytes.*max_json_side_file_bytes"
    ):
        verify_model(tiny_model, key_policy(key_dir, limits=Limits(max_json_side_file_bytes=4096)))


@pytest.mark.slow
def test_llama3_sized_tokenizer_fits_default_limit(tiny_model: Path, key_dir: Path) -> None:
    # A Llama-3 tokenizer.json is about 9 MB (128,256 vocabulary entries, 280,147 merges).
    vocab = {f"tok{i:06d}\\u0120": i for i in range(128_256)}
    merges = [f"tok{i % 997:06d} tok{i % 991:06d}" for i in range(280_147)]
    _write(tiny_model, "tokenizer.json", {"model": {"type": "BPE", "vocab": vocab, "merges": merges}})
    assert (tiny_model / "tokenizer.json").stat().st_size > 9 * 10**6
    _sign(tiny_model, key_dir)
    assert verify_model(tiny_model, key_policy(key_dir)).files == 6
