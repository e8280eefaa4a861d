"""One CLI vocabulary: the `--json` envelope and field names, and one option word per kind of key.

In-process (click's runner) so that every command of the tree runs in a few seconds; the console script
itself is covered by test_cli.py.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from modelsec.cli.main import main

pytestmark = pytest.mark.integration

_CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")
_OLD_ONLY = re.compile(
    r"(?<![\w-])(--key|-k|--trust|--key-file|--sign-key|--attestation-key|--cert|--ca)(?![\w-])"
)


def _leaves(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name), command


LEAVES = dict(_leaves(main))


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _reply(result: Result) -> dict[str, Any]:
    """The one JSON object a `--json` command printed on stdout."""
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.output
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    return doc


def _camel_keys(value: Any, where: str = "") -> list[str]:
    """Every key below `value` not in camelCase (the signed statement's own `predicate` is not ours)."""
    bad: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if not _CAMEL.match(k):
                bad.append(f"{where}.{k}")
            if k != "predicate":
                bad += _camel_keys(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            bad += _camel_keys(v, f"{where}[{i}]")
    return bad


def test_the_walk_finds_every_command() -> None:
    top = {"keygen", "sign", "verify", "digest", "inspect", "release", "serve"}
    groups = {"attest": {"list", "show", "put", "push", "pull"}, "watermark": {"keygen", "embed", "detect"}}
    groups |= {"gate": {"pgd"}, "webhook": {"serve"}}
    expected = top | {f"{g} {c}" for g, cs in groups.items() for c in cs}
    assert {" ".join(p) for p in LEAVES} >= expected


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_every_command_takes_json_and_answers_usage_errors_in_json(path: tuple[str, ...]) -> None:
    """Old code: `attest show`, `serve` and `webhook serve` had no --json; usage errors were plain text."""
    command = LEAVES[path]
    assert any(p.name == "as_json" and "--json" in p.opts for p in command.params), path
    result = _invoke(*path, "--json", "--no-such-option")
    assert result.exit_code == 2, result.output
    assert _reply(result) == {
        "ok": False,
        "command": " ".join(path),
        "error": {"kind": "UsageError", "message": "No such option '--no-such-option'."},
    }
    required = [p for p in command.params if p.required]
    if required:  # a missing argument or option is a usage error too
        result = _invoke(*path, "--json")
        assert result.exit_code == 2, result.output
        doc = _reply(result)
        assert doc["error"]["kind"] == "UsageError" and "Missing" in doc["error"]["message"]
    # Without --json a usage error stays click's text on stderr.
    result = _invoke(*path, "--no-such-option")
    assert result.exit_code == 2 and not result.stdout and "No such option" in result.stderr


def test_a_usage_error_raised_by_the_command_itself_is_json_too(tiny_model: Path) -> None:
    result = _invoke("sign", tiny_model, "--json")
    assert result.exit_code == 2
    assert _reply(result) == {
        "ok": False,
        "command": "sign",
        "error": {"kind": "UsageError", "message": "give --signing-key, or --server with --key-version"},
    }


def test_json_vocabulary_over_a_sign_verify_inspect_round_trip(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    """Old code: snake_case fields, `digest --json` without the `sha256:` prefix, no `command`."""
    priv, pub = key_dir / "ecdsa-p256.key.pem", key_dir / "ecdsa-p256.pub.pem"
    both = ("--trusted-key", pub, "--trusted-key", key_dir / "sm2.pub.pem")
    replies = {}
    for args in (
        ("keygen", "-o", tmp_path / "new"),
        ("sign", tiny_model, "--signing-key", priv, "--signing-key", key_dir / "sm2.key.pem"),
        ("verify", tiny_model, "--trusted-key", pub),
        ("digest", tiny_model),
        ("inspect", tiny_model, *both),
        ("attest", "list", tiny_model, *both),
        ("attest", "show", tiny_model),
        ("watermark", "keygen", "-o", tmp_path / "wm.key"),
    ):
        result = _invoke(*args, "--json")
        assert result.exit_code == 0, result.output
        doc = _reply(result)
        words = [str(a) for a in args if not isinstance(a, Path) and not str(a).startswith("-")]
        assert doc["ok"] is True and doc["command"] == " ".join(words), doc
        assert not _camel_keys(doc), _camel_keys(doc)
        replies[words[0] if words[0] != "attest" else " ".join(words)] = doc

    root = replies["sign"]["rootDigest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", root)
    assert replies["verify"]["rootDigest"] == replies["digest"]["rootDigest"] == root
    assert _invoke("digest", tiny_model).stdout.strip() == root  # the text output spells it the same way
    p256, sm2 = replies["inspect"]["bundles"]
    assert p256["rootDigest"] == root and p256["signer"]["algorithm"] == "ecdsa-p256"
    assert sm2["signer"]["algorithm"] == "sm2" and sm2["signer"]["key"] == "sm2.pub.pem"
    assert all(f["digest"].startswith(f"{p256['hashType']}:") for f in p256["files"])
    assert f"sha256:{root.removeprefix('sha256:')}" in p256["subjectDigests"]
    subjects = [s for b in replies["attest list"]["bundles"] for s in b["subjects"]]
    assert subjects and all(root in s["digests"] for s in subjects)
    assert all(re.fullmatch(r"(sha256|sm3):[0-9a-f]{64}", d) for s in subjects for d in s["digests"])
    shown = replies["attest show"]["bundles"]
    assert {b["predicateType"] for b in shown} == {"https://model_signing/signature/v1.0"}
    assert all(b["signer"] is None and "predicate" in b for b in shown)  # no trusted key: nothing verified


def test_ok_is_the_verdict_and_a_refusal_names_the_error_class(tiny_model: Path, key_dir: Path) -> None:
    assert _invoke("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").exit_code == 0
    shard = tiny_model / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    result = _invoke("verify", tiny_model, "--trusted-key", key_dir / "ecdsa-p256.pub.pem", "--json")
    assert result.exit_code == 1
    doc = _reply(result)
    assert doc["ok"] is False and doc["command"] == "verify"
    assert doc["error"]["kind"] == "DigestMismatchError" and shard.name in doc["error"]["message"]


def test_watermark_detect_ok_means_detected(tmp_path: Path) -> None:
    """Old code: `{"ok": true, "detected": false}` with exit 1."""
    from tests.unit.watermark._helpers import save_state
    from tests.unit.watermark.conftest import mlp_state

    model = save_state(mlp_state(), tmp_path / "model")
    key = tmp_path / "wm.key"
    assert _invoke("watermark", "keygen", "-o", key).exit_code == 0
    result = _invoke(
        "watermark", "embed", model, "--watermark-key", key, "-m", "x", "-o", tmp_path / "m", "--json"
    )
    assert result.exit_code == 0, result.output
    embedded = _reply(result)
    assert not _camel_keys(embedded) and embedded["out"] == str(tmp_path / "m")
    result = _invoke("watermark", "detect", tmp_path / "m", "--watermark-key", key, "--json")
    found = _reply(result)
    assert (
        result.exit_code == 0 and found["ok"] is True and found["detected"] is True and "error" not in found
    )
    result = _invoke("watermark", "detect", model, "--watermark-key", key, "--json")
    missed = _reply(result)
    assert result.exit_code == 1 and missed["ok"] is False and missed["detected"] is False
    assert missed["error"]["kind"] == "GateFailedError" and "not detected" in missed["error"]["message"]
    assert not _camel_keys(found) and not _camel_keys(missed)


# --- one option word per kind of key ----------------------------------------------------------------------

NEW_WORDS = {
    "sign": {"--signing-key", "--tls-ca", "--tls-cert", "--tls-key"},
    "verify": {"--trusted-key"},
    "inspect": {"--trusted-key"},
    "release": {"--signing-key", "--attestation-signing-key", "--watermark-key"},
    "attest list": {"--trusted-key"},
    "attest show": {"--trusted-key"},
    "attest push": {"--tls-ca", "--tls-cert", "--tls-key"},
    "attest pull": {"--tls-ca", "--tls-cert", "--tls-key"},
    "gate pgd": {"--signing-key", "--trusted-key"},
    "watermark embed": {"--watermark-key", "--signing-key"},
    "watermark detect": {"--watermark-key"},
    "webhook serve": {"--tls-cert", "--tls-key", "--store-tls-ca", "--store-tls-cert", "--store-tls-key"},
}


@pytest.mark.parametrize("name", sorted(NEW_WORDS))
def test_help_lists_the_new_words_and_hides_the_old_spellings(name: str) -> None:
    command = LEAVES[tuple(name.split())]
    result = _invoke(*name.split(), "--help")
    assert result.exit_code == 0
    for word in NEW_WORDS[name]:
        assert re.search(rf"^\s+{re.escape(word)}\b", result.stdout, re.M), (name, word)
    ctx = click.Context(command, info_name=name)
    for param in command.params:
        record = param.get_help_record(ctx)
        assert record is None or not _OLD_ONLY.search(record[0]), (name, record)


@pytest.mark.parametrize(
    "name", sorted(" ".join(p) for p, c in LEAVES.items() if any("--trusted-key" in o.opts for o in c.params))
)
def test_no_command_taking_trusted_key_keeps_the_old_spelling_trust(name: str) -> None:
    """`--trusted-key` is the one spelling: the old hidden `--trust` is gone from every command."""
    (option,) = (o for o in LEAVES[tuple(name.split())].params if "--trusted-key" in o.opts)
    assert "--trust" not in option.opts
    assert option.opts == ["--trusted-key"]


@pytest.fixture
def setup(tmp_path: Path, key_dir: Path, tiny_model: Path) -> dict[str, Path]:
    from tests.unit.watermark._helpers import save_state
    from tests.unit.watermark.conftest import mlp_state

    assert _invoke("sign", tiny_model, "--signing-key", key_dir / "ecdsa-p256.key.pem").exit_code == 0
    wm = save_state(mlp_state(), tmp_path / "wm-model")
    (tmp_path / "wm.key").write_text("ab" * 32 + "\n")
    (tmp_path / "policy.yaml").write_text("not: a policy\n")
    return {
        "model": tiny_model,
        "wm_model": wm,
        "wm_key": tmp_path / "wm.key",
        "priv": key_dir / "ecdsa-p256.key.pem",
        "pub": key_dir / "ecdsa-p256.pub.pem",
        "gate": tmp_path / "missing-gate.yaml",
        "policy": tmp_path / "policy.yaml",
        "tmp": tmp_path,
    }


# A command with {OPT} where the option under test goes and {OUT} a fresh output path; old, new spelling.
_RELEASE = (
    "release",
    "{model}",
    "-o",
    "{OUT}",
    "--watermark-key",
    "{wm_key}",
    "-m",
    "x",
    "--gate-config",
    "{gate}",
)
_GATE: tuple[str, ...] = ("gate", "pgd", "{model}", "--arch", "no_such_pkg:f", "--data", "{gate}")
_GATE += ("--eps", "0.1", "--min-robust-accuracy", "0.5", "-o", "{OUT}")
_EMBED = ("watermark", "embed", "{wm_model}", "-m", "x", "-o", "{OUT}")
_REMOTE = ("sign", "{model}", "--key-version", "k/1", "--server", "localhost:1")
_WEBHOOK = ("webhook", "serve", "--policy", "{policy}", "--store", "{tmp}")
_TLS = ("--tls-cert", "{pub}", "--tls-key", "{priv}")
OLD_SPELLINGS = [
    *(
        ((*command, "{model}", "{OPT}", "{pub}"), old, "--trusted-key")
        for command in (("verify",), ("inspect",), ("attest", "list"), ("attest", "show"))
        for old in ("--key", "-k", "--trust")
    ),
    (("sign", "{model}", "{OPT}", "{priv}"), "--key", "--signing-key"),
    (("sign", "{model}", "{OPT}", "{priv}"), "-k", "--signing-key"),
    ((*_RELEASE, "{OPT}", "{priv}"), "--key", "--signing-key"),
    ((*_RELEASE, "{OPT}", "{priv}"), "-k", "--signing-key"),
    (
        (*_RELEASE, "--signing-key", "{priv}", "{OPT}", "{priv}"),
        "--attestation-key",
        "--attestation-signing-key",
    ),
    ((*_GATE, "{OPT}", "{priv}", "--trusted-key", "{pub}"), "--key", "--signing-key"),
    ((*_GATE, "{OPT}", "{priv}", "--trusted-key", "{pub}"), "-k", "--signing-key"),
    ((*_GATE, "--signing-key", "{priv}", "{OPT}", "{pub}"), "--trust", "--trusted-key"),
    ((*_EMBED, "{OPT}", "{wm_key}"), "--key-file", "--watermark-key"),
    ((*_EMBED, "{OPT}", "{wm_key}"), "-k", "--watermark-key"),
    (
        (*_EMBED, "--watermark-key", "{wm_key}", "{OPT}", "{priv}", "--attestation", "{OUT}.sig"),
        "--sign-key",
        "--signing-key",
    ),
    (("watermark", "detect", "{wm_model}", "{OPT}", "{wm_key}"), "--key-file", "--watermark-key"),
    (("watermark", "detect", "{wm_model}", "{OPT}", "{wm_key}"), "-k", "--watermark-key"),
    ((*_REMOTE, "{OPT}", "{pub}"), "--client-cert", "--tls-cert"),
    ((*_REMOTE, "{OPT}", "{priv}"), "--client-key", "--tls-key"),
    ((*_REMOTE, *_TLS, "{OPT}", "{OUT}"), "--ca", "--tls-ca"),
    ((*_WEBHOOK, "{OPT}", "{pub}", "--tls-key", "{priv}"), "--cert", "--tls-cert"),
    ((*_WEBHOOK, "--tls-cert", "{pub}", "{OPT}", "{priv}"), "--key", "--tls-key"),
    ((*_WEBHOOK, *_TLS, "{OPT}", "{pub}"), "--store-ca", "--store-tls-ca"),
    ((*_WEBHOOK, *_TLS, "{OPT}", "{pub}"), "--store-client-cert", "--store-tls-cert"),
    ((*_WEBHOOK, *_TLS, "{OPT}", "{priv}"), "--store-client-key", "--store-tls-key"),
]


@pytest.mark.parametrize(
    "template,old,new", OLD_SPELLINGS, ids=[f"{' '.join(t[:2])}:{o}" for t, o, _ in OLD_SPELLINGS]
)
def test_old_spellings_are_usage_errors(
    template: tuple[str, ...], old: str, new: str, setup: dict[str, Path]
) -> None:
    """Each removed spelling is refused as an unknown option (exit 2), naming it; the new word is accepted."""

    def run(spelling: str) -> tuple[int, str]:
        out = setup["tmp"] / "out"
        argv = [a.format(OPT=spelling, OUT=out, **setup) for a in template]
        result = _invoke(*argv, "--json")
        shutil.rmtree(out, ignore_errors=True)
        return result.exit_code, _reply(result).get("error", {}).get("message", "")

    code_old, message_old = run(old)
    assert code_old == 2
    assert f"No such option '{old}'" in message_old
    _, message_new = run(new)
    assert "No such option" not in message_new
