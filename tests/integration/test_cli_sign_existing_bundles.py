"""`sign` never silently replaces a bundle, never leaves a stale one of another key, and a single file's
signature never takes its folder's bundle name.

Issue 27.8: `modelsec sign DIR/one-file` wrote a one-file bundle over `DIR/model.sig`, exited 0 and broke
`verify DIR`; `sign` overwrote bundles without a word and could leave a stale `model.sm2.sig` beside a new
`model.sig`. The CLI runs in-process (`run_cli`); what a user checks is the exit status, the error kind of
the `--json` envelope, the bundle bytes on disk, and what `verify` then says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelsec.errors import BundleExistsError
from modelsec.signer import load_private_key_file, sign_model
from modelsec.signer.layout import SIGNATURE_FILE_NAMES
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SHARD = "model-00001-of-00002.safetensors"
NAME = {
    "ecdsa-p256": "model.sig",
    "ecdsa-p384": "model.p384.sig",
    "sm2": "model.sm2.sig",
    "ml-dsa-65": "model.ml-dsa-65.sig",
}


def _sign(model: Path, key_dir: Path, *algs: str, extra: tuple[str | Path, ...] = ()) -> dict:  # type: ignore[type-arg]
    keys = [a for alg in algs for a in ("--signing-key", key_dir / f"{alg}.key.pem")]
    r = run_cli("sign", model, *keys, *extra, "--json")
    doc = json.loads(r.stdout)
    assert (r.returncode == 0) == doc["ok"], (r.returncode, r.stdout, r.stderr)
    return doc  # type: ignore[no-any-return]


def _verify(model: Path, key_dir: Path, *algs: str, extra: tuple[str | Path, ...] = ()) -> tuple[int, dict]:  # type: ignore[type-arg]
    keys = [a for alg in algs for a in ("--trusted-key", key_dir / f"{alg}.pub.pem")]
    r = run_cli("verify", model, *keys, *extra, "--json")
    return r.returncode, json.loads(r.stdout)


def _bundles(model: Path) -> dict[str, bytes]:
    return {n: (model / n).read_bytes() for n in SIGNATURE_FILE_NAMES if (model / n).exists()}


def test_one_file_signature_never_takes_the_folders_bundle(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    assert _sign(tiny_model, key_dir, "ecdsa-p256")["ok"]
    before = _bundles(tiny_model)
    files = sorted(p.name for p in tiny_model.iterdir())
    shard = tiny_model / SHARD
    # Without a bundle path, whatever the key's default name (taken or free); onto a reserved name of the
    # file's own folder even with --force; or as a new file inside the signed folder: refused, none written.
    for alg, extra in (
        ("ecdsa-p256", ()),
        ("sm2", ()),
        ("ecdsa-p256", ("--signature", tiny_model / "model.sig", "--force")),
        ("sm2", ("--signature", tiny_model / "model.sm2.sig")),
        ("ecdsa-p256", ("--signature", tiny_model / "model.gate.sig")),
        ("ml-dsa-65", ("--signature", tiny_model / f"{SHARD}.sig")),
    ):
        doc = _sign(shard, key_dir, alg, extra=extra)
        assert not doc["ok"] and doc["error"]["kind"] == "PolicyError", (alg, extra, doc)
        assert "single file" in doc["error"]["message"], doc
        assert _bundles(tiny_model) == before, (alg, extra)
        assert sorted(p.name for p in tiny_model.iterdir()) == files, (alg, extra)
    rc, doc = _verify(tiny_model, key_dir, "ecdsa-p256", "sm2")
    assert rc == 0 and doc["ok"], doc
    # Given a path of its own, the file is signed, verified with that bundle, and the folder still verifies.
    own = tmp_path / f"{SHARD}.sig"
    doc = _sign(shard, key_dir, "sm2", extra=("--signature", own))
    assert doc["ok"] and [b["path"] for b in doc["bundles"]] == [str(own)], doc
    rc, doc = _verify(shard, key_dir, "sm2", extra=("--signature", own))
    assert rc == 0, doc
    assert _bundles(tiny_model) == before
    assert _verify(tiny_model, key_dir, "ecdsa-p256", "sm2")[0] == 0
    # A file alone in an unsigned folder takes FILE.sig beside it; the folder's default names stay free.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(shard, alone / SHARD)
    bundle = alone / f"{SHARD}.sig"
    assert _sign(alone / SHARD, key_dir, "ecdsa-p256", extra=("--signature", bundle))["ok"]
    assert sorted(p.name for p in alone.iterdir()) == sorted([SHARD, bundle.name])
    assert _verify(alone / SHARD, key_dir, "ecdsa-p256", extra=("--signature", bundle))[0] == 0


def test_existing_bundle_is_replaced_only_with_force(tiny_model: Path, key_dir: Path, tmp_path: Path) -> None:
    assert _sign(tiny_model, key_dir, "ecdsa-p256")["ok"]
    old = (tiny_model / "model.sig").read_bytes()
    (tiny_model / "config.json").write_text('{"hidden": 999}')
    for extra in ((), ("--signature", tiny_model / "model.sig")):
        doc = _sign(tiny_model, key_dir, "ecdsa-p256", extra=extra)
        assert not doc["ok"] and doc["error"]["kind"] == "BundleExistsError", doc
        assert (
            doc["error"]["message"].startswith(f"{tiny_model / 'model.sig'}: ")
            and "--force" in doc["error"]["message"]
        )
        assert (tiny_model / "model.sig").read_bytes() == old
    # An explicit path elsewhere is held to the same rule.
    elsewhere = tmp_path / "detached.sig"
    elsewhere.write_bytes(b"keep me")
    doc = _sign(tiny_model, key_dir, "sm2", extra=("--signature", elsewhere))
    assert doc["error"]["kind"] == "BundleExistsError" and elsewhere.read_bytes() == b"keep me", doc
    # The library raises the same, with the bundle named.
    with pytest.raises(BundleExistsError) as e:
        sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    assert e.value.path == str(tiny_model / "model.sig") and e.value.option == "--force"
    assert (tiny_model / "model.sig").read_bytes() == old
    # With --force the bundle is replaced and the changed model verifies.
    doc = _sign(tiny_model, key_dir, "ecdsa-p256", extra=("--force",))
    assert doc["ok"] and doc["removed"] == [], doc
    assert (tiny_model / "model.sig").read_bytes() != old
    rc, doc = _verify(tiny_model, key_dir, "ecdsa-p256")
    assert rc == 0, doc


@pytest.mark.parametrize(("first", "second"), [("ecdsa-p256", "sm2"), ("sm2", "ml-dsa-65")])
def test_another_keys_bundle_is_kept_only_while_it_signs_the_same_files(
    tiny_model: Path, key_dir: Path, tmp_path: Path, first: str, second: str
) -> None:
    assert _sign(tiny_model, key_dir, first)["ok"]
    # A co-signature of the same files: both bundles stay, and a verifier with both keys checks both.
    assert _sign(tiny_model, key_dir, second)["ok"]
    rc, doc = _verify(tiny_model, key_dir, first, second)
    assert rc == 0 and sorted(b["algorithm"] for b in doc["bundles"]) == sorted([first, second]), doc
    cosigned = _bundles(tiny_model)
    # The model changes and only the second key signs again: the first key's bundle would be left stale.
    (tiny_model / "config.json").write_text('{"hidden": 999}')
    (tiny_model / NAME[second]).unlink()
    doc = _sign(tiny_model, key_dir, second)
    assert not doc["ok"] and doc["error"]["kind"] == "BundleExistsError", doc
    message = doc["error"]["message"]
    assert message.startswith(f"{tiny_model / NAME[first]}: ") and "signs another model" in message, message
    assert _bundles(tiny_model) == {NAME[first]: cosigned[NAME[first]]}  # nothing written
    # With --force the stale bundle is removed: one bundle, the new one, is left.
    doc = _sign(tiny_model, key_dir, second, extra=("--force",))
    assert doc["ok"] and doc["removed"] == [str(tiny_model / NAME[first])], doc
    assert set(_bundles(tiny_model)) == {NAME[second]}
    rc, doc = _verify(tiny_model, key_dir, first, second)
    assert rc == 0 and [b["algorithm"] for b in doc["bundles"]] == [second], doc
    # Only the first key configured: no bundle it can check, refused, the other one named as not checked.
    rc, doc = _verify(tiny_model, key_dir, first)
    assert rc == 1 and doc["error"]["kind"] == "SignatureError", doc
    assert f"{NAME[second]} not checked" in doc["error"]["message"], doc
    # verify with two default bundles that disagree (the stale one put back by hand): refused when it holds
    # a key of each; with one key it checks that key's bundle and names the other as not checked.
    (tiny_model / NAME[first]).write_bytes(cosigned[NAME[first]])
    rc, doc = _verify(tiny_model, key_dir, first, second)
    assert rc == 1 and doc["error"]["kind"] == "MalformedArtifactError", doc
    assert "model root digest differs" in doc["error"]["message"], doc
    rc, doc = _verify(tiny_model, key_dir, second)
    assert rc == 0 and doc["skipped"] == [str(tiny_model / NAME[first])], doc


def test_unreadable_default_bundle_beside_the_new_one_is_refused(tiny_model: Path, key_dir: Path) -> None:
    (tiny_model / "model.p384.sig").write_text("not a bundle")
    doc = _sign(tiny_model, key_dir, "ecdsa-p256")
    assert not doc["ok"] and doc["error"]["kind"] == "BundleExistsError", doc
    assert "cannot be read as a weights signature" in doc["error"]["message"]
    assert set(_bundles(tiny_model)) == {"model.p384.sig"}
    doc = _sign(tiny_model, key_dir, "ecdsa-p256", extra=("--force",))
    assert doc["ok"] and doc["removed"] == [str(tiny_model / "model.p384.sig")], doc
    assert _verify(tiny_model, key_dir, "ecdsa-p256")[0] == 0
