"""Run inside a model-signing venv: sign and verify in `key` mode, several operations per process.

Usage: python _ms_tool.py OPS.json   (prints one JSON result per operation, in order, as a list)

Each op is {"op": "sign"|"verify"|"sign-cert", "model", "sig", "key", "ignore": [absolute paths]}, and for
`sign-cert` (the `certificate` method) also "cert" (leaf PEM) and "chain" (PEM files). The signers are
built without `signing.Config()`'s constructor, which in 1.0.x configures a Sigstore signer and
contacts the TUF repository; hashing ignores exactly `ignore` (absolute paths work in every release).
Verify uses the signed serialization (as `model_signing verify key` does) unless `ignore` is given, which
1.0.x needs: it does not apply the signed ignore list.
"""

import json
import sys

from model_signing import hashing, signing, verifying


def run(op):
    if op["op"] in ("sign", "sign-cert"):
        cfg = signing.Config.__new__(signing.Config)
        cfg._hashing_config = hashing.Config().set_ignored_paths(paths=op.get("ignore", []))
        if op["op"] == "sign":
            cfg.use_elliptic_key_signer(private_key=op["key"])
        else:
            cfg.use_certificate_signer(
                private_key=op["key"], signing_certificate=op["cert"], certificate_chain=op["chain"]
            )
        cfg.sign(op["model"], op["sig"])
    else:
        v = verifying.Config().use_elliptic_key_verifier(public_key=op["key"])
        if op.get("ignore"):
            v.set_hashing_config(hashing.Config().set_ignored_paths(paths=op["ignore"]))
        v.verify(op["model"], op["sig"])


results = []
for op in json.load(open(sys.argv[1])):
    try:
        run(op)
        results.append({"ok": True})
    except Exception as e:  # noqa: BLE001 (reported; the test compares outcomes)
        results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(results))
