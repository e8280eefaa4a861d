"""`from modelsec.verifier import load_model` imports only what a plain verified load needs (issue 32 item 5).

A real process: what it has imported is what is under test. Certificate chains, attestation and receipt
checks, archive readers, CEL, plug-in discovery and the signing pipeline are imported by the first call that
needs them, not by the loader's import (every `transformers` process with the runtime guard pays for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Each is imported on first use by what needs it (the module named after it).
NOT_AT_IMPORT = {
    "cryptography.x509": "X.509 authorities (modelsec.verifier.trust.identity)",
    "modelsec.verifier.trust.identity": "policies with authorities",
    "modelsec.verifier.attestations": "policies that require attestations",
    "modelsec.verifier.receipts": "policies with loadReceipt",
    "modelsec.signer.tpm": "load receipts",
    "modelsec.attestations.predicates.gate": "PREDICATE_KINDS",
    "modelsec.attestations.predicates.watermark": "PREDICATE_KINDS",
    "modelsec.policy.cel": "policies with CEL conditions",
    "modelsec.signer.signing": "signing",
    "importlib.metadata": "attestation-store plug-ins",
    "tarfile": "content sniffing of a tar archive",
    "zipfile": "content sniffing of a zip archive",
    "lzma": "content sniffing of xz/lzma streams",
    "bz2": "content sniffing of bzip2 streams",
    "tempfile": "bundle writers",
    "pickletools": "the first content classification",
    "modelsec.verifier.stores": "attestation stores",
    "platform": "the openat2 syscall number (os.uname)",
    "modelsec.signer.schemes.ecdsa": "the scheme registry's first question (a key, a bundle name)",
    "modelsec.signer.schemes.mldsa": "the scheme registry's first question",
    "modelsec.signer.schemes.sm2.scheme": "the scheme registry's first question",
    "modelsec.policy.requirements": "parsing a policy file",
    "modelsec.policy.authorities": "parsing a policy file",
    "modelsec.policy.trust": "parsing a policy file",
    "modelsec.registry.reference": "matching a policy file's patterns",
}

_CODE = """
import json, sys
from modelsec.verifier import load_model
before = sorted(sys.modules)
from modelsec.attestations.predicates import PREDICATE_KINDS, check_gate_predicate
import modelsec.signer
from modelsec.signer.layout import MODEL_IGNORE_PATHS, RESERVED_BUNDLE_NAMES, SIGNATURE_FILE_NAMES
from modelsec.signer.schemes import all_schemes
from modelsec.policy import Authority, KeyWindow, RobustnessRequirement
print(json.dumps({
    "signature_names": list(SIGNATURE_FILE_NAMES),
    "scheme_names": [s.default_bundle_name for s in all_schemes()],
    "ignore": list(MODEL_IGNORE_PATHS),
    "reserved": list(RESERVED_BUNDLE_NAMES),
    "policy_parts": [KeyWindow.__module__, RobustnessRequirement.__module__, str(Authority)],
    "before": before,
    "kinds": len(PREDICATE_KINDS),
    "gate_checker": check_gate_predicate.__module__,
    "sign_model": modelsec.signer.sign_model.__module__,
}))
"""


def test_load_model_import_leaves_the_heavy_modules_for_first_use() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MODELSEC_POLICY", "MODELSEC_MODEL_DIGEST")}
    run = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    imported = set(out["before"])
    assert "modelsec.verifier.loader" in imported
    assert sorted(m for m in NOT_AT_IMPORT if m in imported) == []
    # The lazily loaded names still resolve to the same objects as before.
    assert out["kinds"] == 6
    assert out["gate_checker"] == "modelsec.attestations.predicates.gate"
    assert out["sign_model"] == "modelsec.signer.signing"
    # The names made from the scheme registry are the registry's, in its order, wherever they are asked.
    assert out["signature_names"] == out["scheme_names"]
    assert out["ignore"][4 : 4 + len(out["scheme_names"])] == out["scheme_names"]
    assert out["reserved"][: len(out["scheme_names"])] == out["scheme_names"]
    assert out["policy_parts"][:2] == ["modelsec.policy.trust", "modelsec.policy.requirements"]
    assert "modelsec.policy.authorities.X509Authority" in out["policy_parts"][2]
