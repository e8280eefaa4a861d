"""modelsec: model supply-chain integrity, from the CI signing stage to device memory.

The top-level package stays tiny so that `modelsec --version` and the verifier import fast; the public
API lives in `modelsec.signer` (hash, sign), `modelsec.verifier` (verify, load), `modelsec.attestations`
(in-toto / DSSE / bundles), `modelsec.watermark` and `modelsec.robustness`. `modelsec.Policy` and
`modelsec.PolicySet` are imported on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Policy", "PolicySet", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Policy", "PolicySet"):
        from modelsec import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'modelsec' has no attribute {name!r}")
