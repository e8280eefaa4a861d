"""`modelsec verify` trusts identities without a policy file: keyless options and refused combinations.

The keyless bundle is sigstore-python's staging DSSE vector (tests/vectors/README.md). Its statement is SLSA
provenance, not a model manifest, so a bundle that passes the identity and Sigstore checks is then refused
for its predicate type: that message proves the signature layer accepted it. Certificate mode through the
CLI is in test_certificate_trust.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from modelsec.cli.main import main

pytestmark = pytest.mark.integration

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "sigstore"
BUNDLE = VECTORS / "a.dsse.staging-rekor-v2.txt.sigstore.json"
IDENTITY = (
    "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
    "extremely-dangerous-oidc-beacon.yml@refs/heads/main"
)
ISSUER = "https://token.actions.githubusercontent.com"


def _verify(model: Path, *args: str | Path) -> Result:
    return CliRunner().invoke(main, ["verify", str(model), "-s", str(BUNDLE), *map(str, args)])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    return tmp_path / "m"


def test_keyless_identity_and_issuer(model: Path) -> None:
    pytest.importorskip("sigstore", reason="keyless verification needs the sigstore package")
    staging = ("--trusted-root", "staging")
    ok = _verify(model, "--identity", IDENTITY, "--identity-provider", ISSUER, *staging)
    assert ok.exit_code == 1 and "predicateType must be" in ok.output, ok.output
    # model_signing's underscore spelling; a trusted_root.json given as a file.
    import importlib.resources

    from modelsec.verifier.trust.identity import _EMBEDDED_ROOTS

    embedded = importlib.resources.files("sigstore._store") / _EMBEDDED_ROOTS["staging"] / "trusted_root.json"
    root_file = model.parent / "trusted_root.json"
    root_file.write_bytes(embedded.read_bytes())
    ok = _verify(model, "--identity", IDENTITY, "--identity-provider", ISSUER, "--trusted-root", root_file)
    assert ok.exit_code == 1 and "predicateType must be" in ok.output, ok.output
    for args, reason in (
        (("--identity", IDENTITY + "x", "--identity-provider", ISSUER, *staging), "not an identity"),
        (("--identity", IDENTITY, "--identity-provider", "https://accounts.google.com", *staging), "issuer"),
        # The default root is production: a staging bundle does not chain to it.
        (("--identity", IDENTITY, "--identity-provider", ISSUER), "keyless verification failed"),
    ):
        r = _verify(model, *args, "--json")
        assert r.exit_code == 1, r.output
        error = json.loads(r.stdout)["error"]
        assert error["kind"] == "SignatureError" and reason in error["message"], error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--identity", IDENTITY], "missing --identity-provider"),
        (["--identity-provider", ISSUER], "missing --identity"),
        (["--trusted-root", "staging"], "needs --identity and --identity-provider"),
        (["--certificate-chain", "root.pem", "--identity-provider", ISSUER], "does not apply"),
        (["--certificate-chain", "root.pem", "--trusted-root", "staging"], "does not apply"),
        (["--identity", IDENTITY, "--identity-provider", ISSUER, "--trusted-root", "nope.json"], "neither"),
        (["--identity", IDENTITY, "--identity-provider", ISSUER, "--policy", "p.yaml"], "not both"),
        (["--certificate-chain", "root.pem", "--policy", "p.yaml"], "not both"),
    ],
)
def test_nonsense_combinations_are_usage_errors(model: Path, args: list[str], message: str) -> None:
    r = _verify(model, *args)
    assert r.exit_code == 2 and message in r.output, r.output
    r = _verify(model, *args, "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["kind"] == "UsageError"
