"""A node's TPM 2.0 attestation key, used through tpm2-tools: quotes over PCRs with qualifying data.

The node signs its load receipts with a TPM2_Quote (TPM 2.0 Library Part 3, 18.4) by its attestation key
(AK): a restricted signing key that signs only structures the TPM itself generated, so a quote is a
statement of the TPM, about its PCRs, over the qualifying data the caller chose (the receipt's digest:
`modelsec.verifier.receipts`). The quote itself is the signature over the receipt, so the receipt and the
boot state are shown to come from one TPM (no separate node key and TPM2_Certify are needed).

The AK is a persistent object (handle, default `0x81010002`) that the operator provisions (`tpm2_createek`,
`tpm2_createak`, `tpm2_evictcontrol`; see docs/load-receipts.md). The TPM is reached as tpm2-tools reach it:
`$TPM2TOOLS_TCTI` (e.g. `device:/dev/tpmrm0`, `tabrmd:`, `swtpm:host=127.0.0.1,port=2321`), or the tools'
default. Calls are serialised in this process (a direct TCTI serves one client at a time) and every call
flushes the transient objects and sessions it leaves (a TPM holds only a few).

Not done here: credential activation of the AK against the endorsement key (that is the operator's
enrolment), and any check of the quote (the verifier's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.errors import BackendUnavailableError

__all__ = ["DEFAULT_AK_HANDLE", "TpmAttestationKey", "TpmQuote"]

DEFAULT_AK_HANDLE = 0x81010002
_TIMEOUT_S = 20.0
_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class TpmQuote:
    """A TPM2_Quote as the TPM returned it.

    Attributes:
        attest: The signed TPMS_ATTEST structure (TPM 2.0 Part 2, 10.12.12), marshalled.
        signature: The AK's ECDSA signature over SHA-256(`attest`), DER.
        pcrs: PCR index -> its SHA-256 bank value, read just before the quote (the quote holds only their
            digest; a verifier recomputes it from these values).
    """

    attest: bytes
    signature: bytes
    pcrs: Mapping[int, bytes]


class TpmAttestationKey:
    """The persistent ECDSA P-256 attestation key of this node's TPM (through tpm2-tools).

    Args:
        handle: The AK's persistent handle.
        tcti: The TCTI string; None for `$TPM2TOOLS_TCTI` or the tools' default.
    """

    def __init__(self, handle: int = DEFAULT_AK_HANDLE, *, tcti: str | None = None) -> None:
        self.handle, self.tcti = handle, tcti

    def _run(self, args: Sequence[str], cwd: str) -> None:
        tool = shutil.which(args[0])
        if tool is None:
            raise BackendUnavailableError(f"TPM: {args[0]} is not installed (Debian tpm2-tools)")
        env = dict(os.environ)
        if self.tcti is not None:
            env["TPM2TOOLS_TCTI"] = self.tcti
        try:
            done = subprocess.run(
                [tool, *args[1:]], cwd=cwd, env=env, capture_output=True, timeout=_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BackendUnavailableError(f"TPM: {args[0]}: {e}") from e
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace").strip().splitlines()
            raise BackendUnavailableError(
                f"TPM: {args[0]} failed (exit {done.returncode}): {detail[-1] if detail else 'no message'}"
            )

    def _flush(self, cwd: str) -> None:
        for kind in ("-t", "-s"):
            self._run(["tpm2_flushcontext", kind], cwd)

    def public_key_pem(self) -> bytes:
        """The AK's public key, SubjectPublicKeyInfo PEM (what the operator registers in the policy).

        Raises:
            BackendUnavailableError: tpm2-tools missing, the TPM unreachable, or no key at the handle.
        """
        with _LOCK, tempfile.TemporaryDirectory(prefix="modelsec-tpm-") as tmp:
            self._run(["tpm2_readpublic", "-c", hex(self.handle), "-f", "pem", "-o", "ak.pem"], tmp)
            return (Path(tmp) / "ak.pem").read_bytes()

    def quote(self, qualifying_data: bytes, pcrs: Sequence[int]) -> TpmQuote:
        """A quote over the SHA-256 bank of `pcrs`, with `qualifying_data` as its extraData.

        Args:
            qualifying_data: At most 64 bytes (the TPM's TPM2B_DATA); a digest of what is being signed.
            pcrs: PCR indices 0-23 (sorted and deduplicated here); may be empty.

        Returns:
            The quote and the PCR values read just before it.

        Raises:
            BackendUnavailableError: tpm2-tools missing, the TPM unreachable or refusing the quote.
        """
        if not 1 <= len(qualifying_data) <= 64:
            raise ValueError("qualifying data must be 1-64 bytes")
        indices = sorted(set(pcrs))
        if any(not 0 <= i <= 23 for i in indices):
            raise ValueError("PCR indices must be 0-23")
        selection = "sha256:" + ",".join(map(str, indices)) if indices else "sha256:"
        with _LOCK, tempfile.TemporaryDirectory(prefix="modelsec-tpm-") as tmp:
            values: dict[int, bytes] = {}
            if indices:
                self._run(["tpm2_pcrread", selection, "-o", "pcrs.bin"], tmp)
                raw = (Path(tmp) / "pcrs.bin").read_bytes()
                if len(raw) != 32 * len(indices):
                    raise BackendUnavailableError(f"TPM: tpm2_pcrread returned {len(raw)} bytes")
                values = {i: raw[32 * n : 32 * (n + 1)] for n, i in enumerate(indices)}
            try:
                self._run(
                    [
                        "tpm2_quote", "-c", hex(self.handle), "-l", selection, "-q", qualifying_data.hex(),
                        "-g", "sha256", "-m", "attest.bin", "-s", "sig.der", "-f", "plain",
                    ],
                    tmp,
                )  # fmt: skip
            finally:
                self._flush(tmp)
            return TpmQuote(
                (Path(tmp) / "attest.bin").read_bytes(), (Path(tmp) / "sig.der").read_bytes(), values
            )
