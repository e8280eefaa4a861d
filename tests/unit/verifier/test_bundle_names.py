"""A default bundle name says which algorithm signed (user trial 10); model.sig is model_signing's, for any.

`cp model.sig model.p384.sig` and `cp model.sig model.sm2.sig` were verified one way and refused the other;
both are refused now, and one bundle given twice is one signer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import SignatureError
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import verify_model
from tests.support.policies import key_policy

P256, P384, SM2 = SignatureAlgorithm.ECDSA_P256, SignatureAlgorithm.ECDSA_P384, SignatureAlgorithm.SM2
MLDSA65 = SignatureAlgorithm.ML_DSA_65


def _sign(model: Path, key_dir: Path, *algs: SignatureAlgorithm, to: Path | None = None) -> None:
    signers = [load_private_key_file(key_dir / f"{a.value}.key.pem") for a in algs]
    sign_model(model, signers, signature_paths={0: to} if to else None)


@pytest.mark.parametrize(
    ("name", "named_alg"),
    [("model.p384.sig", "ecdsa-p384"), ("model.sm2.sig", "sm2"), ("model.ml-dsa-65.sig", "ml-dsa-65")],
)
def test_a_bundle_copied_under_another_default_name_is_refused(
    tiny_model: Path, key_dir: Path, name: str, named_alg: str
) -> None:
    _sign(tiny_model, key_dir, P256)
    shutil.copy(tiny_model / "model.sig", tiny_model / name)
    for policy in (key_policy(key_dir, P256), key_policy(key_dir, P256, SM2, P384, MLDSA65)):
        with pytest.raises(SignatureError) as info:
            verify_model(tiny_model, policy)
        message = str(info.value)
        assert name in message and named_alg in message and "ecdsa-p256" in message, message
    # Given explicitly, the name still says what signed it.
    with pytest.raises(SignatureError, match=named_alg):
        verify_model(tiny_model, key_policy(key_dir, P256), bundles=[tiny_model / name])


def test_a_real_bundle_of_its_name_still_verifies(tiny_model: Path, key_dir: Path) -> None:
    _sign(tiny_model, key_dir, P256, P384, SM2, MLDSA65)
    result = verify_model(tiny_model, key_policy(key_dir, P256, P384, SM2, MLDSA65))
    assert sorted(b.path.name for b in result.bundles) == [
        "model.ml-dsa-65.sig",
        "model.p384.sig",
        "model.sig",
        "model.sm2.sig",
    ]


@pytest.mark.parametrize("alg", [P384, MLDSA65])
def test_model_sig_takes_any_scheme_model_signing_writes_there(
    tiny_model: Path, key_dir: Path, alg: SignatureAlgorithm
) -> None:
    _sign(tiny_model, key_dir, alg, to=tiny_model / "model.sig")
    assert verify_model(tiny_model, key_policy(key_dir, alg)).algorithms == (alg,)


def test_model_sig_signed_by_sm2_is_refused(tiny_model: Path, key_dir: Path) -> None:
    _sign(tiny_model, key_dir, SM2, to=tiny_model / "model.sig")
    with pytest.raises(SignatureError, match=r"model\.sig.*not sm2.*sm2 key"):
        verify_model(tiny_model, key_policy(key_dir, SM2))


def test_other_names_given_explicitly_keep_working_and_one_bundle_is_listed_once(
    tiny_model: Path, key_dir: Path, tmp_path: Path
) -> None:
    _sign(tiny_model, key_dir, P256)
    shutil.copy(tiny_model / "model.sig", tmp_path / "release-7.sig")
    bundles = [tmp_path / "release-7.sig", tiny_model / "model.sig", tiny_model / "model.sig"]
    result = verify_model(tiny_model, key_policy(key_dir, P256), bundles=bundles)
    assert [b.path for b in result.bundles] == [tmp_path / "release-7.sig"]


def test_model_signing_p384_bundle_at_its_default_name_verifies(tiny_model: Path, key_dir: Path) -> None:
    signing = pytest.importorskip("model_signing.signing", reason="model_signing is the reference signer")
    hashing = pytest.importorskip("model_signing.hashing")
    config = signing.Config.__new__(signing.Config)  # as tests/integration/_ms_tool.py: no Sigstore set-up
    config._hashing_config = hashing.Config()
    config.use_elliptic_key_signer(private_key=key_dir / "ecdsa-p384.key.pem")
    config.sign(tiny_model, tiny_model / "model.sig")
    assert verify_model(tiny_model, key_policy(key_dir, P384)).algorithms == (P384,)
