"""A node's TPM 2.0 attestation key, used through tpm2-tools: quotes over PCRs with qualifying data.

The node signs its load receipts with a TPM2_Quote (TPM 2.0 Library Part 3, 18.4) by its attestation key
(AK): a restricted signing key that signs only structures the TPM itself generated, so a quote is a
statement of the TPM, about its PCRs, over the qualifying data the caller chose (the receipt's digest:
`modelsec.verifier.receipts`). The quote itself is the signature over the receipt, so the receipt and the
boot state are shown to come from one TPM (no separate node key and TPM2_Certify are needed).

The AK is a persistent object (handle, default `0x81010002`) that the operator provisions (`tpm2_createek`,
`tpm2_createak`, `tpm2_evictcontrol`; see docs/load-receipts.md). The TPM is reached as tpm2-tools reach it:
`$TPM2TOOLS_TCTI` (e.g. `device:/dev/tpmrm0`, `tabrmd:`, `swtpm:host=127.0.0.1,port=2321`), or the TSS
default. Two access paths, the same TPM commands (TPM2_PCR_Read, TPM2_Quote):

- `esys`: the TSS's ESAPI in this process (PyPI `tpm2-pytss` or Debian `python3-tpm2-pytss`), one context
  opened per call and closed after it, so that a direct TCTI (which serves one client at a time) is never
  held between receipts; no transient object is created (the AK is persistent, the session is the
  password session). The default where `tpm2_pytss` imports.
- `tools`: tpm2-tools processes (`tpm2_pcrread`, `tpm2_quote`, `tpm2_flushcontext`), each call flushing the
  transient objects and sessions it leaves (a TPM holds only a few). About ten times slower per quote.

`$MODELSEC_TPM_ACCESS` (`esys` or `tools`) overrides the choice. Calls are serialised in this process.

Not done here: credential activation of the AK against the endorsement key (that is the operator's
enrolment), and any check of the quote (the verifier's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsec.errors import BackendUnavailableError

__all__ = [
    "ACCESS_ENV",
    "DEFAULT_AK_HANDLE",
    "AkPublic",
    "TpmAttestationKey",
    "TpmQuote",
    "esys_available",
    "parse_ak_public",
]

DEFAULT_AK_HANDLE = 0x81010002
ACCESS_ENV = "MODELSEC_TPM_ACCESS"
_ACCESS = ("esys", "tools")
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


def _import_pytss() -> None:
    """Import `tpm2_pytss` once, without the deprecation warnings its own imports of cryptography raise."""
    from cryptography.utils import CryptographyDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        import tpm2_pytss
        import tpm2_pytss.internal.crypto  # noqa: F401


def esys_available() -> bool:
    """Whether the TSS bindings (`tpm2_pytss`) import here."""
    try:
        _import_pytss()
    except ImportError:
        return False
    return True


class TpmAttestationKey:
    """The persistent ECDSA P-256 attestation key of this node's TPM.

    Args:
        handle: The AK's persistent handle.
        tcti: The TCTI string; None for `$TPM2TOOLS_TCTI` or the TSS default.
        access: `esys`, `tools`, or None: `$MODELSEC_TPM_ACCESS`, else `esys` where `tpm2_pytss` imports.

    Raises:
        BackendUnavailableError: `access` (or `$MODELSEC_TPM_ACCESS`) is neither `esys` nor `tools`.
    """

    def __init__(
        self, handle: int = DEFAULT_AK_HANDLE, *, tcti: str | None = None, access: str | None = None
    ) -> None:
        self.handle, self.tcti = handle, tcti
        access = access or os.environ.get(ACCESS_ENV) or None
        if access is not None and access not in _ACCESS:
            raise BackendUnavailableError(f"TPM: access {access!r} is neither esys nor tools (${ACCESS_ENV})")
        self.access = access or ("esys" if esys_available() else "tools")

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
        with _LOCK:
            if self.access == "esys":
                return self._quote_esys(qualifying_data, indices)
            return self._quote_tools(qualifying_data, indices)

    def _quote_tools(self, qualifying_data: bytes, indices: list[int]) -> TpmQuote:
        selection = "sha256:" + ",".join(map(str, indices)) if indices else "sha256:"
        with tempfile.TemporaryDirectory(prefix="modelsec-tpm-") as tmp:
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

    def _quote_esys(self, qualifying_data: bytes, indices: list[int]) -> TpmQuote:
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

        _import_pytss()
        from tpm2_pytss import ESAPI, TSS2_Exception
        from tpm2_pytss.constants import TPM2_ALG
        from tpm2_pytss.types import TPML_PCR_SELECTION, TPMT_SIG_SCHEME

        selection = TPML_PCR_SELECTION.parse("sha256:" + ",".join(map(str, indices)) if indices else "")
        tcti = self.tcti or os.environ.get("TPM2TOOLS_TCTI") or None
        try:
            ctx = ESAPI(tcti)
        except (TSS2_Exception, RuntimeError, OSError) as e:
            raise BackendUnavailableError(f"TPM: cannot open the TCTI {tcti or '(default)'}: {e}") from e
        try:
            ak = ctx.tr_from_tpmpublic(self.handle)
            values: dict[int, bytes] = {}
            pending = list(indices)
            while pending:
                # TPM2_PCR_Read returns at most 8 digests per call (TPM 2.0 Part 3, 22.4): ask for the rest.
                _, read, digests = ctx.pcr_read(
                    TPML_PCR_SELECTION.parse("sha256:" + ",".join(map(str, pending)))
                )
                got = [
                    i
                    for sel in read
                    for i in range(8 * sel.sizeofSelect)
                    if sel.pcrSelect[i // 8] >> (i % 8) & 1
                ]
                if not got:
                    raise BackendUnavailableError(f"TPM: TPM2_PCR_Read returned none of PCRs {pending}")
                for i, d in zip(got, digests, strict=True):
                    values[i] = bytes(d)
                pending = [i for i in pending if i not in values]
            scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
            scheme.details.any.hashAlg = TPM2_ALG.SHA256
            attest, signature = ctx.quote(ak, selection, qualifying_data, scheme)
            ecdsa = signature.signature.ecdsa
            der = encode_dss_signature(
                int.from_bytes(bytes(ecdsa.signatureR), "big"), int.from_bytes(bytes(ecdsa.signatureS), "big")
            )
            return TpmQuote(bytes(attest), der, values)
        except TSS2_Exception as e:
            raise BackendUnavailableError(f"TPM: {e}") from e
        finally:
            ctx.close()


_TPM_ALG_ECC = 0x0023
_TPM_ALG_SHA256 = 0x000B
_TPM_ALG_NULL = 0x0010
_TPM_ECC_NIST_P256 = 0x0003
# TPMA_OBJECT (TPM 2.0 Part 2, 8.3): what makes a key an attestation key that never left its TPM.
_AK_ATTRIBUTES = {
    "fixedTPM": 1 << 1,
    "fixedParent": 1 << 4,
    "sensitiveDataOrigin": 1 << 5,
    "restricted": 1 << 16,
    "sign": 1 << 18,
}
_DECRYPT = 1 << 17


@dataclass(frozen=True, slots=True)
class AkPublic:
    """An attestation key's public area, as the node's TPM gives it (`tpm2_readpublic -o ak.pub`).

    Attributes:
        name: Its TPM name: nameAlg (SHA-256) || SHA-256(TPMT_PUBLIC) (TPM 2.0 Part 1, 16): what
            TPM2_MakeCredential binds the credential to, and what ActivateCredential checks in the TPM.
        public_key_pem: The same key as SubjectPublicKeyInfo PEM: what the operator registers in the policy.
    """

    name: bytes
    public_key_pem: bytes


def parse_ak_public(data: bytes, *, what: str) -> AkPublic:
    """Parse a marshalled TPM2B_PUBLIC of an ECDSA P-256 attestation key and derive its name and PEM.

    The credential activation of the AK against the EK (docs/load-receipts.md, "Enrolment") proves that a
    key of this *name* is resident in the TPM that holds the EK; this function ties that name to the PEM the
    operator registers (both come from these bytes), and refuses a key that is not an attestation key:
    `fixedTPM`, `fixedParent`, `sensitiveDataOrigin`, `restricted` and `sign` set, `decrypt` clear, ECC
    NIST P-256 with SHA-256 as nameAlg (TPM 2.0 Part 2, 12.2.4 and 8.3).

    Raises:
        KeyMaterialError: Truncated or trailing bytes, not ECC P-256 / SHA-256, or not a restricted signing
            key that was generated in and cannot leave its TPM (the message names the attribute).
    """
    import hashlib
    import struct

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from modelsec.errors import KeyMaterialError

    def take(at: int, n: int) -> bytes:
        if at + n > len(data):
            raise KeyMaterialError(f"{what}: TPM2B_PUBLIC is truncated")
        return data[at : at + n]

    def u16(at: int) -> int:
        value: int = struct.unpack(">H", take(at, 2))[0]
        return value

    size = u16(0)
    if size + 2 != len(data):
        raise KeyMaterialError(f"{what}: TPM2B_PUBLIC size {size} does not match its {len(data) - 2} bytes")
    area = data[2:]
    if u16(2) != _TPM_ALG_ECC or u16(4) != _TPM_ALG_SHA256:
        raise KeyMaterialError(f"{what}: not an ECC key with SHA-256 as its name algorithm")
    attributes = struct.unpack(">I", take(6, 4))[0]
    missing = [n for n, bit in _AK_ATTRIBUTES.items() if not attributes & bit]
    if missing or attributes & _DECRYPT:
        why = f"lacks {', '.join(missing)}" if missing else "can decrypt"
        raise KeyMaterialError(f"{what}: not an attestation key (it {why})")
    at = 10 + 2 + u16(10)  # authPolicy
    if u16(at) != _TPM_ALG_NULL:  # a restricted signing key has no symmetric algorithm
        raise KeyMaterialError(f"{what}: an attestation key has no symmetric algorithm")
    at += 2
    scheme = u16(at)
    at += 2 if scheme == _TPM_ALG_NULL else 4
    if u16(at) != _TPM_ECC_NIST_P256:
        raise KeyMaterialError(f"{what}: not a NIST P-256 key")
    at += 2
    at += 2 if u16(at) == _TPM_ALG_NULL else 4  # kdf
    x_len = u16(at)
    x = take(at + 2, x_len)
    at += 2 + x_len
    y_len = u16(at)
    y = take(at + 2, y_len)
    at += 2 + y_len
    if at != len(data) or x_len != 32 or y_len != 32:
        raise KeyMaterialError(f"{what}: malformed ECC point or bytes after the TPMT_PUBLIC")
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + x + y)
    except ValueError as e:
        raise KeyMaterialError(f"{what}: the public point is not on P-256") from e
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return AkPublic(struct.pack(">H", _TPM_ALG_SHA256) + hashlib.sha256(area).digest(), pem)
