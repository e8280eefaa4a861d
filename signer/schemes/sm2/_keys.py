"""SM2 key values: `Sm2PublicKey`, `Sm2PrivateKey` and their byte-exact SPKI / PKCS#8 / SEC 1 encodings.

Key files are read through OpenSSL where libcrypto 3 with SM2 is present (`_sm2_libcrypto`): modelsec checks
the PEM, the DER structure (`asn1crypto`, strict) and, for an encrypted key, bounds the KDF cost; OpenSSL then
decrypts the key, computes or checks its public key, and returns d and [d]G. Without libcrypto 3 (the gmssl
fallback) unencrypted keys are read with `asn1crypto` and [d]G comes from the pure-Python `_scalar_mult`;
encrypted keys then need OpenSSL and are refused.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from modelsec.errors import KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.schemes.sm2 import _libcrypto as _sm2_libcrypto
from modelsec.signer.schemes.sm2._asn1 import (
    _MAX_KEY_FILE_BYTES,
    OID_HMAC_WITH_SM3,
    _pem_decode,
    _pem_encode,
    check_encrypted,
    ec_private_key,
    is_encrypted_pkcs8,
    pkcs8_der,
    pkcs8_encrypt,
    private_key_info,
    spki_der,
    spki_point,
)
from modelsec.signer.schemes.sm2._core import (
    _SM2_CURVE,
    SM2_GX,
    SM2_GY,
    SM2_ORDER,
    SM2_P,
    _on_curve,
    _scalar_mult,
)

__all__ = ["Sm2PrivateKey", "Sm2PublicKey", "generate_private_key"]

_T = TypeVar("_T")
_WHAT = "SM2 private key"


def _public_point(private_value: int) -> tuple[int, int] | None:
    """[d]G: through OpenSSL where libcrypto 3 is present, else pure Python (the gmssl fallback only)."""
    point = _sm2_libcrypto.public_point(private_value)
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
        if len(data) > _MAX_KEY_FILE_BYTES:
            raise KeyMaterialError(f"{what}: larger than {_MAX_KEY_FILE_BYTES} bytes")
        return cls.from_encoded_point(spki_point(bytes(data), what))

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
        return spki_der(self.encoded_point())

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
        self._init(private_value, Sm2PublicKey(*point))

    def _init(self, private_value: int, public_key: Sm2PublicKey) -> None:
        self._d = private_value
        self._public_key = public_key
        self._native = {}
        self._native_lock = threading.Lock()

    @classmethod
    def _from_parts(
        cls, private_value: int, embedded: bytes | None, der: bytes, structure: str
    ) -> Sm2PrivateKey:
        """A key from its checked DER: decoded by OpenSSL where present, else [d]G in Python (gmssl path)."""
        if not 1 <= private_value <= SM2_ORDER - 2:
            raise KeyMaterialError(f"{_WHAT}: scalar is outside [1, n-2]")
        if not _sm2_libcrypto.available():
            key = cls(private_value)
            if embedded is not None and embedded != key.public_key.encoded_point():
                raise KeyMaterialError(f"{_WHAT}: embedded public key does not match the private key")
            return key
        if embedded is not None:
            Sm2PublicKey.from_encoded_point(embedded)  # a compressed or off-curve point is refused here
        d, point = _sm2_libcrypto.decode_private_key(der, structure, None, _WHAT)
        if d != private_value:  # OpenSSL read another scalar than the strict parser: never use either
            raise KeyMaterialError(f"{_WHAT}: OpenSSL and the DER parser disagree on the key")
        key = cls.__new__(cls)
        key._init(d, Sm2PublicKey(*point))
        return key

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

        The inner key is an RFC 5915 `ECPrivateKey`; an embedded public key must equal [d]G. An encrypted
        key's header is checked (PBES2; PBKDF2 with at most 10 000 000 iterations or scrypt with at most
        256 MiB; AES-CBC or SM4-CBC) before OpenSSL decrypts it; without libcrypto 3 it is refused.

        Args:
            data: DER bytes.
            password: Required for an encrypted key; must be None for a plain one.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an encryption scheme, KDF, PRF or cipher that
                modelsec or this OpenSSL build does not support.
            KeyMaterialError: Malformed input, wrong or missing password, KDF cost out of bounds, d outside
                [1, n-2], a public key that does not match d, or an encrypted key without libcrypto 3.
        """
        if not isinstance(data, bytes | bytearray):
            raise KeyMaterialError(f"{_WHAT}: DER data must be bytes")
        data = bytes(data)
        if len(data) > _MAX_KEY_FILE_BYTES:
            raise KeyMaterialError(f"{_WHAT}: larger than {_MAX_KEY_FILE_BYTES} bytes")
        if is_encrypted_pkcs8(data):
            if password is None:
                raise KeyMaterialError(f"{_WHAT}: the key is encrypted; a password is required")
            return cls._from_encrypted(data, password)
        if password is not None:
            raise KeyMaterialError(f"{_WHAT}: a password was given but the key is not encrypted")
        d, embedded = private_key_info(data, _WHAT)
        return cls._from_parts(d, embedded, data, "PrivateKeyInfo")

    @classmethod
    def _from_encrypted(cls, der: bytes, password: bytes) -> Sm2PrivateKey:
        if not isinstance(password, bytes | bytearray):
            raise KeyMaterialError(f"{_WHAT}: the password must be bytes")
        # OpenSSL bounds neither PBKDF2 iterations nor scrypt memory: check the header before it runs.
        prf = check_encrypted(der, _WHAT)
        if not _sm2_libcrypto.available():
            raise KeyMaterialError(
                f"{_WHAT}: encrypted keys are decrypted by OpenSSL, and libcrypto >= 3.0 with SM2 is not "
                "available (gmssl fallback); install OpenSSL 3 or decrypt the key with `openssl pkcs8`"
            )
        if prf and not _sm2_libcrypto.knows_oid(OID_HMAC_WITH_SM3):
            raise UnsupportedAlgorithmError(
                f"{_WHAT}: PBKDF2 PRF {prf} is not supported by {_sm2_libcrypto.version()} (OpenSSL >= 3.2 "
                "knows it); re-encrypt the key with `openssl pkcs8 -topk8 -v2 sm4-cbc -v2prf hmacWithSHA256`"
            )
        plain = _sm2_libcrypto.decrypt_pkcs8(der, bytes(password), _WHAT)
        # The decrypted key gets the same checks as an unencrypted one (and the scheme dispatch an
        # UnsupportedAlgorithmError for another key type).
        d, embedded = private_key_info(plain, _WHAT)
        return cls._from_parts(d, embedded, plain, "PrivateKeyInfo")

    @classmethod
    def from_pem(cls, data: bytes, password: bytes | None = None) -> Sm2PrivateKey:
        """Load a PEM key: `PRIVATE KEY`, `ENCRYPTED PRIVATE KEY` (PKCS#8), `EC`/`SM2 PRIVATE KEY` (SEC 1).

        See `from_der` for what is checked and which component reads the key.

        Args:
            data: PEM bytes with exactly one key block.
            password: Required for `ENCRYPTED PRIVATE KEY`; must be None otherwise.

        Returns:
            The private key.

        Raises:
            UnsupportedAlgorithmError: Not an SM2 key, or an unsupported encryption scheme.
            KeyMaterialError: Not PEM, legacy PEM encryption, wrong or missing password, malformed key, or
                an encrypted key without libcrypto 3.
        """
        labels = ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "EC PRIVATE KEY", "SM2 PRIVATE KEY")
        label, der = _pem_decode(data, labels, _WHAT)
        if label in ("EC PRIVATE KEY", "SM2 PRIVATE KEY"):  # SEC 1; `openssl ec` 3.0 writes "SM2 PRIVATE KEY"
            if password is not None:
                raise KeyMaterialError(f"{_WHAT}: a password was given but the key is not encrypted")
            d, embedded = ec_private_key(der, _WHAT, require_curve=True)
            return cls._from_parts(d, embedded, der, "type-specific")
        if (label == "ENCRYPTED PRIVATE KEY") != is_encrypted_pkcs8(der):
            raise KeyMaterialError(f"{_WHAT}: PEM label {label!r} does not match its content")
        return cls.from_der(der, password)

    # -- writing -------------------------------------------------------------------------------------------

    def to_der(self) -> bytes:
        """Return the unencrypted DER PKCS#8 key, byte-identical to the DER inside `openssl pkey`'s PEM.

        That is also `openssl pkcs8 -topk8 -nocrypt -outform DER`; `openssl pkey -outform DER` writes SEC 1.

        Returns:
            `PrivateKeyInfo { 0, {id-ecPublicKey, sm2p256v1}, ECPrivateKey { 1, d (32 bytes), [1] point } }`.
        """
        return pkcs8_der(self._d, self._public_key.encoded_point())

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
        return _pem_encode("ENCRYPTED PRIVATE KEY", pkcs8_encrypt(self.to_der(), password))


def generate_private_key() -> Sm2PrivateKey:
    """Generate a key with d drawn uniformly from [1, n-2] by `secrets` (GB/T 32918.1-2016 §6.1).

    Returns:
        A new private key.
    """
    return Sm2PrivateKey(secrets.randbelow(SM2_ORDER - 2) + 1)
