"""SM2 key values: `Sm2PublicKey`, `Sm2PrivateKey` and their byte-exact SPKI / PKCS#8 / SEC 1 encodings.

A private key's public key [d]G is computed by OpenSSL when libcrypto 3 with SM2 is present
(`modelsec.signer._sm2_libcrypto.public_point`), else by the pure-Python `_scalar_mult` (gmssl fallback).
"""

from __future__ import annotations

import hmac
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from modelsec.errors import KeyMaterialError
from modelsec.signer._sm2_asn1 import (
    _BIT_STRING,
    _MAX_KEY_FILE_BYTES,
    _OCTET_STRING,
    _OID_EC_PUBLIC_KEY,
    _SEQUENCE,
    _SM2_ALGORITHM_DER,
    _check_sm2_algorithm,
    _DerReader,
    _pem_decode,
    _pem_encode,
    _pkcs8_decrypt,
    _pkcs8_encrypt,
    _tlv,
)
from modelsec.signer._sm2_core import (
    _SM2_CURVE,
    BACKEND_ENV,
    SM2_GX,
    SM2_GY,
    SM2_ORDER,
    SM2_P,
    _on_curve,
    _scalar_mult,
)
from modelsec.signer.der import encode_integer

__all__ = ["Sm2PrivateKey", "Sm2PublicKey", "generate_private_key"]

_T = TypeVar("_T")


def _public_point(private_value: int) -> tuple[int, int] | None:
    """[d]G: through OpenSSL unless it is missing or `MODELSEC_SM2_BACKEND=gmssl`, else pure Python."""
    if os.environ.get(BACKEND_ENV, "").strip().lower() != "gmssl":
        from modelsec.signer._sm2_libcrypto import public_point

        point = public_point(private_value)
        if point is not None:
            return point
    return _scalar_mult(private_value, SM2_GX, SM2_GY, _SM2_CURVE)


# --------------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class Sm2PublicKey:
    """An SM2 public key: a validated affine point of the SM2 curve (GB/T 32918.1-2016 §6.2.1).

    Construction checks that both coordinates are field elements and that the point satisfies the curve
    equation; the point at infinity cannot be represented. The cofactor is 1, so every such point has order n.

    Attributes:
        x: Affine x coordinate, in [0, p-1].
        y: Affine y coordinate, in [0, p-1].
    """

    x: int
    y: int

    def __post_init__(self) -> None:
        for name, value in (("x", self.x), ("y", self.y)):
            if type(value) is not int:
                raise KeyMaterialError(f"SM2 public key: {name} must be an int")
            if not 0 <= value < SM2_P:
                raise KeyMaterialError(f"SM2 public key: {name} is not a field element")
        if not _on_curve(self.x, self.y, _SM2_CURVE):
            raise KeyMaterialError("SM2 public key: point is not on the SM2 curve")

    def __repr__(self) -> str:
        return f"Sm2PublicKey(x=0x{self.x:064x}, y=0x{self.y:064x})"

    @classmethod
    def from_encoded_point(cls, point: bytes) -> Sm2PublicKey:
        """Load an uncompressed SEC 1 point `04 || x || y` (65 bytes).

        Args:
            point: The encoded point.

        Returns:
            The validated public key.

        Raises:
            KeyMaterialError: Wrong length, compressed or hybrid form, or not on the curve.
        """
        if len(point) != 65 or point[0] != 0x04:
            raise KeyMaterialError("SM2 public key: expected a 65-byte uncompressed point (04 || x || y)")
        return cls(int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big"))

    @classmethod
    def from_der(cls, data: bytes) -> Sm2PublicKey:
        """Load a DER SubjectPublicKeyInfo (RFC 5280 §4.1, RFC 5480 §2) holding an SM2 key.

        Args:
            data: DER bytes: algorithm id-ecPublicKey with namedCurve 1.2.156.10197.1.301, uncompressed point.

        Returns:
            The validated public key.

        Raises:
            UnsupportedAlgorithmError: Another algorithm or curve (e.g. P-256, RSA, Ed25519).
            KeyMaterialError: Malformed or non-DER input, compressed point, or a point not on the curve.
        """
        what = "SM2 public key"
        if not isinstance(data, bytes | bytearray):
            raise KeyMaterialError(f"{what}: DER data must be bytes")
        outer = _DerReader(bytes(data), what)
        spki = outer.sequence("SubjectPublicKeyInfo")
        outer.end()
        oid, params = spki.algorithm("algorithm")
        _check_sm2_algorithm(oid, params, what)
        point = spki.bit_string("subjectPublicKey")
        spki.end()
        return cls.from_encoded_point(point)

    @classmethod
    def from_pem(cls, data: bytes) -> Sm2PublicKey:
        """Load a PEM `PUBLIC KEY` (SubjectPublicKeyInfo) holding an SM2 key.

        Args:
            data: PEM bytes with exactly one `PUBLIC KEY` block.

        Returns:
            The validated public key.

        Raises:
            UnsupportedAlgorithmError: Another algorithm or curve.
            KeyMaterialError: Not PEM, another PEM label, or malformed key (see `from_der`).
        """
        _, der = _pem_decode(data, ("PUBLIC KEY",), "SM2 public key")
        return cls.from_der(der)

    def encoded_point(self) -> bytes:
        """Return the uncompressed SEC 1 encoding `04 || x || y` (65 bytes)."""
        return b"\x04" + self.x.to_bytes(32, "big") + self.y.to_bytes(32, "big")

    def to_der(self) -> bytes:
        """Return the DER SubjectPublicKeyInfo, byte-identical to `openssl pkey -pubin -outform DER`."""
        return _tlv(_SEQUENCE, _SM2_ALGORITHM_DER + _tlv(_BIT_STRING, b"\x00" + self.encoded_point()))

    def to_pem(self) -> bytes:
        """Return the PEM `PUBLIC KEY`, byte-identical to `openssl pkey -pubin -pubout` (64-column base64)."""
        return _pem_encode("PUBLIC KEY", self.to_der())


class Sm2PrivateKey:
    """An SM2 private key: a scalar d in [1, n-2] and its public key [d]G (GB/T 32918.1-2016 §6.1).

    d = n-1 is excluded because signing divides by 1 + d (GB/T 32918.2-2016 §6.1 A6). The scalar never
    appears in `repr` or `str`. Keys compare equal in constant time on d; they are not hashable, and
    cannot be pickled or copied (serialize them with `to_pem(password)`).
    """

    __slots__ = ("_d", "_native", "_native_lock", "_public_key")

    _d: int
    _native: dict[object, object]
    _native_lock: threading.Lock
    _public_key: Sm2PublicKey

    def __init__(self, private_value: int) -> None:
        """Create a key from its scalar; derives the public key (OpenSSL, else pure Python: milliseconds).

        Args:
            private_value: The secret scalar d.

        Raises:
            KeyMaterialError: d is not an int in [1, n-2].
        """
        if type(private_value) is not int or not 1 <= private_value <= SM2_ORDER - 2:
            raise KeyMaterialError("SM2 private key: scalar is outside [1, n-2]")
        point = _public_point(private_value)
        if point is None:  # Unreachable for d in [1, n-1]; kept so a broken formula fails closed.
            raise KeyMaterialError("SM2 private key: [d]G is the point at infinity")
        self._d = private_value
        self._public_key = Sm2PublicKey(*point)
        self._native = {}
        self._native_lock = threading.Lock()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Sm2PrivateKey(public_key={self._public_key!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sm2PrivateKey):
            return NotImplemented
        return hmac.compare_digest(self._d.to_bytes(32, "big"), other._d.to_bytes(32, "big"))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Sm2PrivateKey cannot be pickled; serialize it with to_pem(password)")

    @property
    def public_key(self) -> Sm2PublicKey:
        """The public key [d]G."""
        return self._public_key

    def private_value(self) -> int:
        """Return the secret scalar d. For backends only; never log or persist it outside `to_pem`."""
        return self._d

    def native_key(self, backend: object, load: Callable[[], _T]) -> _T:
        """Return `backend`'s native form of this key (e.g. an OpenSSL `EVP_PKEY`), loading it once.

        For backends only. Decoding a PKCS#8 key costs OpenSSL about as much as a signature, so a backend
        keeps its decoded key here, with this key, instead of decoding it for every signature. The object
        `load` returns lives exactly as long as this key (or until `drop_native_keys`): it must free its
        native resources when it is garbage-collected.

        Args:
            backend: The backend that owns the native key (one native key per backend).
            load: Creates the native key; called at most once per backend while the key holds it.

        Returns:
            What `load` returned for `backend`.
        """
        native = self._native.get(backend)
        if native is None:
            with self._native_lock:
                native = self._native.get(backend)
                if native is None:
                    native = self._native[backend] = load()
        return cast(_T, native)

    def drop_native_keys(self) -> None:
        """Release every backend's native form of this key now (backends load it again on the next use)."""
        with self._native_lock:
            self._native.clear()

    # -- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_der(cls, data: bytes, password: bytes | None = None) -> Sm2PrivateKey:
        """Load a DER PKCS#8 key: `PrivateKeyInfo` (RFC 5208/5958) or `EncryptedPrivateKeyInfo` (PBES2).

        The inner key is an RFC 5915 `ECPrivateKey`; an embedded public key must equal [d]G.

        Args:
            data: DER bytes.
            password: Required for an encrypted key; must be None for a plain one.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported encryption scheme.
            KeyMaterialError: Malformed input, wrong or missing password, d outside [1, n-2], or a public key
                that does not match d.
        """
        what = "SM2 private key"
        if not isinstance(data, bytes | bytearray):
            raise KeyMaterialError(f"{what}: DER data must be bytes")
        data = bytes(data)
        if len(data) > _MAX_KEY_FILE_BYTES:
            raise KeyMaterialError(f"{what}: larger than {_MAX_KEY_FILE_BYTES} bytes")
        probe = _DerReader(data, what).sequence("PKCS#8")
        if probe.peek_tag() == _SEQUENCE:
            if password is None:
                raise KeyMaterialError(f"{what}: the key is encrypted; a password is required")
            data = _pkcs8_decrypt(data, password, what)
        elif password is not None:
            raise KeyMaterialError(f"{what}: a password was given but the key is not encrypted")
        return cls._from_private_key_info(data, what)

    @classmethod
    def from_pem(cls, data: bytes, password: bytes | None = None) -> Sm2PrivateKey:
        """Load a PEM key: `PRIVATE KEY`, `ENCRYPTED PRIVATE KEY` (PKCS#8), `EC`/`SM2 PRIVATE KEY` (SEC 1).

        Args:
            data: PEM bytes with exactly one key block.
            password: Required for `ENCRYPTED PRIVATE KEY`; must be None otherwise.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported encryption scheme.
            KeyMaterialError: Not PEM, legacy PEM encryption, wrong or missing password, malformed key.
        """
        what = "SM2 private key"
        labels = ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "EC PRIVATE KEY", "SM2 PRIVATE KEY")
        label, der = _pem_decode(data, labels, what)
        if label in ("EC PRIVATE KEY", "SM2 PRIVATE KEY"):  # SEC 1; `openssl ec` 3.0 writes "SM2 PRIVATE KEY"
            if password is not None:
                raise KeyMaterialError(f"{what}: a password was given but the key is not encrypted")
            outer = _DerReader(der, what)
            key = cls._from_ec_private_key(outer.read(_SEQUENCE, "ECPrivateKey"), what, require_curve=True)
            outer.end()
            return key
        encrypted = label == "ENCRYPTED PRIVATE KEY"
        probe = _DerReader(der, what).sequence("PKCS#8")
        if encrypted != (probe.peek_tag() == _SEQUENCE):
            raise KeyMaterialError(f"{what}: PEM label {label!r} does not match its content")
        return cls.from_der(der, password)

    @classmethod
    def _from_private_key_info(cls, der: bytes, what: str) -> Sm2PrivateKey:
        outer = _DerReader(der, what)
        info = outer.sequence("PrivateKeyInfo")
        outer.end()
        version = info.integer("version")
        if version not in (0, 1):
            raise KeyMaterialError(f"{what}: unsupported PKCS#8 version {version}")
        oid, params = info.algorithm("privateKeyAlgorithm")
        _check_sm2_algorithm(oid, params, what)
        inner = _DerReader(info.octet_string("privateKey"), what)
        key = cls._from_ec_private_key(inner.read(_SEQUENCE, "ECPrivateKey"), what, require_curve=False)
        inner.end()
        if info.peek_tag() == 0xA0:  # attributes [0]: carry nothing modelsec uses
            info.read_any()
        if info.peek_tag() == 0x81:  # OneAsymmetricKey publicKey [1] (RFC 5958)
            embedded = info.read_any()[1]
            if embedded[:1] != b"\x00" or embedded[1:] != key.public_key.encoded_point():
                raise KeyMaterialError(f"{what}: PKCS#8 public key does not match the private key")
        info.end()
        return key

    @classmethod
    def _from_ec_private_key(cls, body: bytes, what: str, *, require_curve: bool) -> Sm2PrivateKey:
        # RFC 5915 §3: ECPrivateKey ::= SEQUENCE { version 1, privateKey OCTET STRING,
        #   parameters [0] ECParameters OPTIONAL, publicKey [1] BIT STRING OPTIONAL }
        seq = _DerReader(body, what)
        if seq.integer("ECPrivateKey.version") != 1:
            raise KeyMaterialError(f"{what}: ECPrivateKey version must be 1")
        raw = seq.octet_string("ECPrivateKey.privateKey")
        if not 1 <= len(raw) <= 32:
            raise KeyMaterialError(f"{what}: private scalar must be 1 to 32 bytes")
        if seq.peek_tag() == 0xA0:
            params = _DerReader(seq.read_any()[1], what)
            _check_sm2_algorithm(_OID_EC_PUBLIC_KEY, params, what)
        elif require_curve:
            raise KeyMaterialError(f"{what}: SEC 1 key without curve parameters")
        embedded: bytes | None = None
        if seq.peek_tag() == 0xA1:
            wrapper = _DerReader(seq.read_any()[1], what)
            embedded = wrapper.bit_string("ECPrivateKey.publicKey")
            wrapper.end()
        seq.end()
        key = cls(int.from_bytes(raw, "big"))
        if embedded is not None and embedded != key.public_key.encoded_point():
            raise KeyMaterialError(f"{what}: embedded public key does not match the private key")
        return key

    # -- writing -------------------------------------------------------------------------------------------

    def to_der(self) -> bytes:
        """Return the unencrypted DER PKCS#8 key, byte-identical to the DER inside `openssl pkey`'s PEM.

        That is also `openssl pkcs8 -topk8 -nocrypt -outform DER`; `openssl pkey -outform DER` writes SEC 1.

        Returns:
            `PrivateKeyInfo { 0, {id-ecPublicKey, sm2p256v1}, ECPrivateKey { 1, d (32 bytes), [1] point } }`.
        """
        ec_private_key = _tlv(
            _SEQUENCE,
            encode_integer(1)
            + _tlv(_OCTET_STRING, self._d.to_bytes(32, "big"))
            + _tlv(0xA1, _tlv(_BIT_STRING, b"\x00" + self._public_key.encoded_point())),
        )
        return _tlv(_SEQUENCE, encode_integer(0) + _SM2_ALGORITHM_DER + _tlv(_OCTET_STRING, ec_private_key))

    def to_pem(self, password: bytes | None = None) -> bytes:
        """Return the key as PEM PKCS#8, encrypted when a password is given.

        Without a password the output is byte-identical to `openssl pkey`. With a password it is an
        `ENCRYPTED PRIVATE KEY` using PBES2 (RFC 8018) with PBKDF2-HMAC-SHA256 (`PBKDF2_ITERATIONS`
        iterations, 16-byte random salt) and AES-256-CBC, the scheme `openssl pkey -aes256` uses (with more
        iterations), so `openssl pkey -passin` reads it.

        Args:
            password: The passphrase, or None for an unencrypted key.

        Returns:
            PEM bytes.

        Raises:
            KeyMaterialError: The password is empty.
        """
        if password is None:
            return _pem_encode("PRIVATE KEY", self.to_der())
        return _pem_encode("ENCRYPTED PRIVATE KEY", _pkcs8_encrypt(self.to_der(), password))


def generate_private_key() -> Sm2PrivateKey:
    """Generate a key with d drawn uniformly from [1, n-2] by `secrets` (GB/T 32918.1-2016 §6.1).

    Returns:
        A new private key.
    """
    return Sm2PrivateKey(secrets.randbelow(SM2_ORDER - 2) + 1)
