"""Enrolment of a node's attestation key by credential activation against its endorsement key (issue 33).

The documented operator step (docs/load-receipts.md, "Enrolment"), run as written against real software TPMs:
the operator makes a credential offline for the AK's name under the node's EK public key
(TPM2_MakeCredential, `tpm2_makecredential -T none`), and only the TPM that holds both that EK and a key of
that name recovers the secret (TPM2_ActivateCredential). `parse_ak_public` ties the name to the PEM the
operator registers and refuses a key that is not an attestation key.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from modelsec.errors import KeyMaterialError
from modelsec.signer.keys import load_trusted_key, load_trusted_key_file
from modelsec.signer.tpm import DEFAULT_AK_HANDLE, parse_ak_public
from tests.support.tpm import SoftwareTpm

pytestmark = pytest.mark.integration


def _ak_public(node: SoftwareTpm, out: Path) -> Path:
    """Node: the AK's public area (`tpm2_readpublic -o`), what it sends the operator."""
    node.tools("tpm2_readpublic", "-c", hex(DEFAULT_AK_HANDLE), "-o", str(out))
    return out


def _make_credential(ek_pub: Path, name: bytes, secret: bytes, d: Path) -> Path:
    """Operator, offline (no TPM): a credential for `name` that only the TPM of `ek_pub` can open."""
    (d / "secret.bin").write_bytes(secret)
    subprocess.run(
        [
            "tpm2_makecredential", "-T", "none", "-u", str(ek_pub), "-s", str(d / "secret.bin"),
            "-n", name.hex(), "-o", str(d / "cred.blob"),
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "cred.blob"


def _activate(node: SoftwareTpm, credential: Path, d: Path) -> bytes:
    """Node: ActivateCredential with its AK and EK (EK use authorised by PolicySecret of the endorsement
    hierarchy)."""
    ek, session = str(d / "ek.ctx"), str(d / "session.ctx")
    node.tools("tpm2_createek", "-c", ek, "-G", "ecc")
    try:
        node.tools("tpm2_startauthsession", "--policy-session", "-S", session)
        node.tools("tpm2_policysecret", "-S", session, "-c", "e")
        node.tools(
            "tpm2_activatecredential", "-c", hex(DEFAULT_AK_HANDLE), "-C", ek, "-i", str(credential),
            "-o", str(d / "recovered.bin"), "-P", f"session:{session}",
        )  # fmt: skip
    finally:
        for flush in (["tpm2_flushcontext", session], ["tpm2_flushcontext", "-t"]):
            try:
                node.tools(*flush)
            except subprocess.CalledProcessError:
                pass
    return (d / "recovered.bin").read_bytes()


def test_credential_activation_enrols_the_ak_of_this_tpm_only(
    tmp_path: Path, swtpm: SoftwareTpm, swtpm_other: SoftwareTpm
) -> None:
    ek_a = (
        swtpm.ak_pem.parent / "ek.pub"
    )  # the node's EK public key (in a real node: from its EK certificate)
    ak_a = parse_ak_public(_ak_public(swtpm, tmp_path / "a.ak.pub").read_bytes(), what="node-a AK")
    # The name the TPM reports and the PEM the operator registers both come from these bytes.
    name_file = tmp_path / "a.name"
    swtpm.tools("tpm2_readpublic", "-c", hex(DEFAULT_AK_HANDLE), "-n", str(name_file))
    assert ak_a.name == name_file.read_bytes()
    assert load_trusted_key(ak_a.public_key_pem, name="a").keyid == load_trusted_key_file(swtpm.ak_pem).keyid
    secret = b"enrol node-a " + bytes(range(19))
    (tmp_path / "ok").mkdir()
    credential = _make_credential(ek_a, ak_a.name, secret, tmp_path / "ok")
    assert _activate(swtpm, credential, tmp_path / "ok") == secret
    # Node B's AK presented under node A's EK: node A holds no key of that name, node B not that EK.
    ak_b = parse_ak_public(_ak_public(swtpm_other, tmp_path / "b.ak.pub").read_bytes(), what="node-b AK")
    (tmp_path / "swap").mkdir()
    foreign = _make_credential(ek_a, ak_b.name, secret, tmp_path / "swap")
    for node in (swtpm, swtpm_other):
        with pytest.raises(subprocess.CalledProcessError):
            _activate(node, foreign, tmp_path / "swap")
    assert not (tmp_path / "swap" / "recovered.bin").exists()


def test_a_key_that_is_not_an_attestation_key_is_refused(tmp_path: Path, swtpm: SoftwareTpm) -> None:
    # The EK is a restricted *decryption* key: it cannot sign, so it can be no node key.
    ek_pub = (swtpm.ak_pem.parent / "ek.pub").read_bytes()
    with pytest.raises(KeyMaterialError, match="not an attestation key"):
        parse_ak_public(ek_pub, what="ek.pub")
    good = _ak_public(swtpm, tmp_path / "ak.pub").read_bytes()
    with pytest.raises(KeyMaterialError, match=r"truncated|does not match"):
        parse_ak_public(good[:-1], what="ak.pub")
    with pytest.raises(KeyMaterialError, match="does not match"):
        parse_ak_public(good + b"\x00", what="ak.pub")
