"""modelsec: model supply-chain integrity, from the CI signing stage to device memory.

The top-level package stays tiny so that `modelsec --version` and the verifier import fast; the public
API lives in `modelsec.signer` (hash, sign), `modelsec.verifier` (verify, load), `modelsec.attestations`
(in-toto / DSSE / bundles), `modelsec.watermark` and `modelsec.robustness`.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
