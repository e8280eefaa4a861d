"""Private keys in PKCS#11 tokens (HSMs, smart cards, SoftHSM2), named by RFC 7512 `pkcs11:` URIs.

A key source for `modelsec.signer.keys.key_source`: `pkcs11:token=ci;object=release?module-path=/usr/lib/
softhsm/libsofthsm2.so&pin-source=file:/run/secrets/pin` opens the token through `python-pkcs11` (the
`pkcs11` extra), logs in as the user and signs inside the token. The private key never leaves it: the
host hashes the message (SHA-256 for P-256, SHA-384 for P-384), the token computes raw `CKM_ECDSA` over
the hash and returns r||s, and the host encodes that as the same low-S DER `SEQUENCE { r, s }` the PEM
backend emits. Every signature is checked against the token's public key object before it is returned,
so a public object that does not belong to the private key is caught at the first signature, not by
verifiers.

What the URI may say (RFC 7512; anything else is refused, never ignored): path attributes `token`,
`manufacturer`, `model`, `serial`, `slot-id` (which token), `object`, `id` (which key; at least one), `type`
(`private` only); query attributes `module-path` (the PKCS#11 library, required: loading it runs its code,
so it carries the same trust as a key file path) and `pin-source`. The PIN is read from
`pin-source=file:PATH` (one trailing newline dropped) or `pin-source=env:VAR`, or is handed to `open` by the
caller (the service's `passwordEnv`); `pin-value` is refused because a PIN in the URI ends up in shell
history, process lists and CI logs. Paths in the URI are used as given: write them absolute.

Supported keys: ECDSA on P-256 and P-384 (`CKK_EC` with those named curves) with a public key object of
the same `CKA_ID` (or, without an id, the same label). SM2 is refused: PKCS#11 defines no SM2 mechanism
(vendors number their own) and SoftHSM2 offers none. Keys that need a context-specific login per
signature (`CKA_ALWAYS_AUTHENTICATE`) are not supported.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any
from urllib.parse import unquote_to_bytes

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import BackendUnavailableError, KeyMaterialError, UnsupportedAlgorithmError
from modelsec.signer.der import encode_signature
from modelsec.signer.schemes.base import KeyBackend
from modelsec.signer.schemes.ecdsa import ECDSA_P256, ECDSA_P384, EcdsaScheme

__all__ = ["Pkcs11KeySource", "Pkcs11Uri", "parse_pkcs11_uri"]

_TOKEN_ATTRS = {"token": "label", "manufacturer": "manufacturer_id", "model": "model", "serial": "serial"}
_PATH_ATTRS = frozenset({*_TOKEN_ATTRS, "slot-id", "object", "id", "type"})
_QUERY_ATTRS = frozenset({"module-path", "pin-source"})
_REFUSED_ATTRS = {
    "pin-value": "a PIN in the URI ends up in shell history, process lists and CI logs; give "
    "pin-source=file:PATH or pin-source=env:VAR",
    "module-name": "module search paths are not supported; give module-path=/absolute/path/to/module.so",
}
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_MAX_PIN_BYTES = 4096
_EC_SCHEMES: tuple[EcdsaScheme, ...] = (ECDSA_P256, ECDSA_P384)
_SM2_CURVE_OID_DER = bytes.fromhex("06082a811ccf5501822d")  # 1.2.156.10197.1.301 sm2p256v1


@dataclass(frozen=True, slots=True)
class Pkcs11Uri:
    """A parsed `pkcs11:` URI (RFC 7512), percent-decoding done; see the module docstring for the fields."""

    module_path: str
    token: str | None = None
    manufacturer: str | None = None
    model: str | None = None
    serial: str | None = None
    slot_id: int | None = None
    object: str | None = None
    id: bytes | None = None
    pin_source: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """`pkcs11:token=…;object=…` with the key-selecting attributes only, for diagnostics."""
        parts = [f"token={self.token}" if self.token is not None else ""]
        parts += [f"object={self.object}" if self.object is not None else ""]
        parts += [f"id={self.id.hex()}" if self.id is not None else ""]
        return "pkcs11:" + ";".join(p for p in parts if p)


def _attributes(
    part: str, separator: str, allowed: frozenset[str], where: str
) -> Iterator[tuple[str, bytes]]:
    """Split `name=value` pairs, refusing unknown, repeated and malformed ones; values percent-decoded."""
    seen: set[str] = set()
    for item in part.split(separator) if part else ():
        name, eq, value = item.partition("=")
        if name in _REFUSED_ATTRS:
            raise KeyMaterialError(f"{where}: {name} is refused: {_REFUSED_ATTRS[name]}")
        if not eq or not value:
            raise KeyMaterialError(
                f"{where}: expected NAME=VALUE, got an attribute without a value ({name!r})"
            )
        if name not in allowed:
            raise KeyMaterialError(
                f"{where}: attribute {name!r} is not supported here (use {', '.join(sorted(allowed))})"
            )
        if name in seen:
            raise KeyMaterialError(f"{where}: attribute {name!r} is given twice")
        if _BAD_PERCENT.search(value):
            raise KeyMaterialError(f"{where}: attribute {name!r} has a malformed percent-encoding")
        seen.add(name)
        yield name, unquote_to_bytes(value)


def _text(name: str, value: bytes, where: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyMaterialError(f"{where}: attribute {name!r} is not UTF-8") from None


def parse_pkcs11_uri(text: str) -> Pkcs11Uri:
    """Parse a `pkcs11:` URI strictly (RFC 7512, with the attributes the module docstring lists).

    Nothing of a refused URI is echoed beyond attribute names: it may hold a PIN.

    Args:
        text: The URI, `pkcs11:` path attributes separated by `;`, then `?` and `&`-separated query ones.

    Returns:
        The parsed URI; the token and the module are not touched.

    Raises:
        KeyMaterialError: Not a `pkcs11:` URI; an unknown, repeated, empty or malformed attribute; `pin-value`
            or `module-name`; `type` other than `private`; no `object` or `id`; no `module-path`.
    """
    where = "pkcs11 URI"
    scheme, _, rest = text.partition(":")
    if scheme.lower() != "pkcs11":
        raise KeyMaterialError(f"{where}: does not start with pkcs11:")
    path, _, query = rest.partition("?")
    values: dict[str, bytes] = dict(_attributes(path, ";", _PATH_ATTRS, where))
    values.update(_attributes(query, "&", _QUERY_ATTRS, where))
    texts = {k: _text(k, v, where) for k, v in values.items() if k != "id"}
    if texts.get("type", "private") != "private":
        raise KeyMaterialError(
            f"{where}: type={texts['type']} cannot sign; name the private key (type=private)"
        )
    if "object" not in texts and "id" not in values:
        raise KeyMaterialError(f"{where}: name the key with object=LABEL or id=%XX…")
    if "module-path" not in texts:
        raise KeyMaterialError(f"{where}: module-path=/path/to/pkcs11-module.so is required")
    slot_id = texts.get("slot-id")
    if slot_id is not None and not slot_id.isdigit():
        raise KeyMaterialError(f"{where}: slot-id must be a decimal number")
    return Pkcs11Uri(
        module_path=texts["module-path"],
        token=texts.get("token"),
        manufacturer=texts.get("manufacturer"),
        model=texts.get("model"),
        serial=texts.get("serial"),
        slot_id=int(slot_id) if slot_id is not None else None,
        object=texts.get("object"),
        id=values.get("id"),
        pin_source=texts.get("pin-source"),
    )


def _read_pin(source: str, where: str) -> str:
    """The PIN a `pin-source` names: `env:VAR`, or `file:PATH` (`file:///PATH` too)."""
    kind, _, value = source.partition(":")
    if kind == "env" and value:
        pin = os.environ.get(value, "")
        if not pin:
            raise KeyMaterialError(f"{where}: pin-source ${value} is not set or empty")
        return pin
    if kind != "file" or not value:
        raise KeyMaterialError(f"{where}: pin-source must be file:PATH or env:VAR (a PIN is never a literal)")
    path = "/" + value.removeprefix("//").lstrip("/") if value.startswith("/") else value
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PIN_BYTES + 1)
    except OSError as e:
        raise KeyMaterialError(f"{where}: cannot read the PIN file {path}: {e.strerror}") from e
    data = data.removesuffix(b"\n").removesuffix(b"\r")
    if not data or len(data) > _MAX_PIN_BYTES:
        raise KeyMaterialError(f"{where}: the PIN file {path} is empty or larger than {_MAX_PIN_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyMaterialError(f"{where}: the PIN file {path} is not UTF-8") from None


def _binding() -> ModuleType:
    """python-pkcs11; a ModuleNotFoundError names the `pkcs11` extra (`modelsec.lazy`) to the CLI."""
    import pkcs11

    return pkcs11


@dataclass(frozen=True, slots=True)
class Pkcs11KeySource:
    """A private key in a PKCS#11 token, named by an RFC 7512 URI (see the module docstring)."""

    uri: Pkcs11Uri
    reference: str = field(compare=False)

    @classmethod
    def from_uri(cls, text: str) -> Pkcs11KeySource:
        """Parse `text` (`parse_pkcs11_uri`); the token is not opened yet. Same errors."""
        uri = parse_pkcs11_uri(text)
        return cls(uri, uri.describe())

    def open(self, *, password: bytes | None = None) -> KeyBackend:
        """Log in to the token and find the key pair; the private key stays in the token.

        Args:
            password: The user PIN, when the URI has no `pin-source` (the service's `passwordEnv`).

        Returns:
            A backend signing inside the token. All keys of one token share one logged-in session (PKCS#11
            logs in per application and token), which signs one message at a time.

        Raises:
            KeyMaterialError: No PIN or two; the module cannot be loaded; no such token (not present,
                removed) or several; a wrong or locked PIN, or another PIN than the token was opened with;
                no such private key or several, or no public key object beside it.
            UnsupportedAlgorithmError: Not an EC key on P-256 or P-384 (SM2 is refused: see the module
                docstring).
            ModuleNotFoundError: python-pkcs11 is not installed (`pip install 'modelsec[pkcs11]'`).
        """
        where = self.reference
        p11 = _binding()
        pin = self._pin(password, where)
        try:
            lib = p11.lib(self.uri.module_path)
        except p11.PKCS11Error as e:
            raise KeyMaterialError(
                f"{where}: cannot load the PKCS#11 module {self.uri.module_path}: {e}"
            ) from e
        token = self._token(p11, lib, where)
        with _LOGINS_LOCK:
            login = self._login(p11, token, pin, where)
        try:
            with login.lock:
                return self._backend(p11, login, where)
        except p11.PKCS11Error as e:
            raise KeyMaterialError(f"{where}: cannot read the key pair from the token: {_why(e)}") from e

    def _login(self, p11: ModuleType, token: Any, pin: str, where: str) -> _Login:
        """The logged-in session of `token`: the cached one (same PIN required), else a new login."""
        slot = (os.path.realpath(self.uri.module_path), int(token.slot.slot_id))
        digest = hashlib.sha256(pin.encode("utf-8")).digest()
        login = _LOGINS.get(slot)
        if login is not None:
            if not hmac.compare_digest(login.pin_digest, digest):
                raise KeyMaterialError(f"{where}: the token is already logged in with another PIN")
            return login
        try:
            session = token.open(user_pin=pin)
        except p11.exceptions.PinIncorrect:
            raise KeyMaterialError(f"{where}: the token refused the PIN (wrong PIN)") from None
        except p11.exceptions.PinLocked:
            raise KeyMaterialError(f"{where}: the token's user PIN is locked (too many wrong PINs)") from None
        except p11.PKCS11Error as e:
            raise KeyMaterialError(f"{where}: cannot log in to the token: {_why(e)}") from e
        _LOGINS[slot] = login = _Login(slot, session, digest)
        return login

    def _pin(self, password: bytes | None, where: str) -> str:
        source = self.uri.pin_source
        if source is not None and password is not None:
            raise KeyMaterialError(f"{where}: the URI has a pin-source and a PIN was given as well; give one")
        if source is not None:
            return _read_pin(source, where)
        if password is None:
            raise KeyMaterialError(
                f"{where}: no PIN: add pin-source=file:PATH or pin-source=env:VAR to the URI"
            )
        try:
            return password.decode("utf-8")
        except UnicodeDecodeError:
            raise KeyMaterialError(f"{where}: the PIN is not UTF-8") from None

    def _token(self, p11: ModuleType, lib: Any, where: str) -> Any:
        wanted = {attr: getattr(self.uri, attr) for attr in ("token", "manufacturer", "model", "serial")}
        matches = []
        try:
            slots = lib.get_slots(token_present=True)
        except p11.PKCS11Error as e:
            raise KeyMaterialError(
                f"{where}: cannot list the slots of {self.uri.module_path}: {_why(e)}"
            ) from e
        for slot in slots:
            if self.uri.slot_id is not None and slot.slot_id != self.uri.slot_id:
                continue
            try:
                token = slot.get_token()
            except p11.PKCS11Error:
                continue  # a token removed since the slot list was read
            have = {k: _token_text(getattr(token, v)) for k, v in _TOKEN_ATTRS.items()}
            if all(value is None or have[k] == value for k, value in wanted.items()):
                matches.append(token)
        if not matches:
            raise KeyMaterialError(
                f"{where}: no token matching the URI is present in {self.uri.module_path} "
                "(not initialised, removed, or another label)"
            )
        if len(matches) > 1:
            raise KeyMaterialError(f"{where}: {len(matches)} tokens match the URI; name one with token=LABEL")
        return matches[0]

    def _backend(self, p11: ModuleType, login: _Login, where: str) -> KeyBackend:
        session = login.session
        Attribute, ObjectClass = p11.Attribute, p11.ObjectClass
        selector: dict[Any, Any] = {}
        if self.uri.object is not None:
            selector[Attribute.LABEL] = self.uri.object
        if self.uri.id is not None:
            selector[Attribute.ID] = self.uri.id
        private = list(session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY, **selector}))
        if not private:
            raise KeyMaterialError(f"{where}: the token holds no private key matching the URI")
        if len(private) > 1:
            raise KeyMaterialError(f"{where}: {len(private)} private keys match the URI; name one with id=")
        key = private[0]
        if key[Attribute.KEY_TYPE] != p11.KeyType.EC:
            raise UnsupportedAlgorithmError(
                f"{where}: {key[Attribute.KEY_TYPE].name} keys are not supported in tokens "
                "(use ECDSA P-256 or P-384)"
            )
        scheme = _scheme(bytes(key[Attribute.EC_PARAMS]), where)
        key_id = bytes(key[Attribute.ID] or b"")
        pair = {Attribute.ID: key_id} if key_id else {Attribute.LABEL: key[Attribute.LABEL]}
        public = list(session.get_objects({Attribute.CLASS: ObjectClass.PUBLIC_KEY, **pair}))
        if len(public) != 1:
            raise KeyMaterialError(
                f"{where}: expected one public key object with the private key's "
                f"{'id' if key_id else 'label'}, found {len(public)} (the bundle needs the public key)"
            )
        point = _ec_point(bytes(public[0][Attribute.EC_POINT]), scheme)
        try:
            public_key = ec.EllipticCurvePublicKey.from_encoded_point(scheme.curve(), point)
        except ValueError as e:
            raise KeyMaterialError(f"{where}: the token's public key is not a point on the curve") from e
        return _Pkcs11Backend(
            scheme, public_key, login, key, p11, where, ec.ECDSA(Prehashed(scheme.hash())), scheme.hash().name
        )


@dataclass(frozen=True, slots=True)
class _Login:
    slot: tuple[str, int]  # (real path of the module, slot id)
    session: Any = field(repr=False)
    pin_digest: bytes = field(repr=False)
    # A PKCS#11 session runs one operation at a time; the gRPC service signs from many threads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


# PKCS#11 login state belongs to the application and the token, not to a session: a second login fails
# (CKR_USER_ALREADY_LOGGED_IN), so all keys of one token share one logged-in session, for the process.
_LOGINS: dict[tuple[str, int], _Login] = {}
_LOGINS_LOCK = threading.Lock()


def _why(error: Exception) -> str:
    return str(error) or type(error).__name__


def _token_text(value: object) -> str:
    """A token info field (blank-padded, bytes for the serial) as text."""
    raw = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return raw.rstrip(" \x00")


def _scheme(ec_params: bytes, where: str) -> EcdsaScheme:
    for scheme in _EC_SCHEMES:
        if ec_params == scheme.curve_oid_der:
            return scheme
    if ec_params == _SM2_CURVE_OID_DER:
        raise UnsupportedAlgorithmError(
            f"{where}: SM2 keys in PKCS#11 tokens are not supported: PKCS#11 defines no SM2 mechanism and "
            "SoftHSM2 offers none; sign with an SM2 PEM key instead"
        )
    raise UnsupportedAlgorithmError(
        f"{where}: the key's EC domain parameters (CKA_EC_PARAMS {ec_params.hex()}) are not a supported "
        "named curve (use P-256 or P-384)"
    )


def _coordinate_bytes(scheme: EcdsaScheme) -> int:
    return (scheme.order.bit_length() + 7) // 8


def _ec_point(value: bytes, scheme: EcdsaScheme) -> bytes:
    """The uncompressed point from `CKA_EC_POINT`: DER OCTET STRING (the standard) or raw (some tokens)."""
    size = 1 + 2 * _coordinate_bytes(scheme)
    if len(value) == size:
        return value
    if len(value) == size + 2 and value[:2] == bytes([0x04, size]):
        return value[2:]
    if len(value) == size + 3 and value[:3] == bytes([0x04, 0x81, size]):
        return value[3:]
    return value  # from_encoded_point refuses it with a KeyMaterialError


@dataclass(frozen=True, slots=True, repr=False)
class _Pkcs11Backend:
    _scheme: EcdsaScheme
    _public: ec.EllipticCurvePublicKey
    _login: _Login
    _key: Any
    _p11: ModuleType
    _where: str
    # Made once per key, not per signature: the check's verification parameters and the digest's name.
    _check_algorithm: ec.ECDSA
    _digest_name: str

    def __repr__(self) -> str:
        return f"<PKCS#11 key backend {self.algorithm} {self._where}>"

    @property
    def algorithm(self) -> SignatureAlgorithm:
        return self._scheme.algorithm

    def public_key_pem(self) -> bytes:
        return self._public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, message: bytes) -> bytes:
        """Sign `message` in the token: low-S DER, checked against the public key object.

        Raises:
            BackendUnavailableError: The token or the key was removed, or the session is gone (retryable:
                the next `open` logs in afresh).
            KeyMaterialError: The token refused to sign, returned a malformed signature, or one that does not
                verify under its public key object.
        """
        return self._checked(*self._token_sign(message))

    def sign_many(self, messages: Sequence[bytes]) -> list[bytes]:
        """Sign each of `messages` in the token, checking signature i while the token makes signature i+1.

        Each signature is checked against the public key object exactly as `sign` checks it, on a second
        thread: the token's `C_Sign` (python-pkcs11) and OpenSSL's ECDSA verification (`cryptography`) both
        release the GIL, so with a second core the check is off the token's critical path. Nothing is
        returned unless every signature passes: one that fails fails the whole call, and the caller has
        nothing to write.

        Args:
            messages: The messages, in order.

        Returns:
            Their signatures (low-S DER), in the same order.

        Raises:
            BackendUnavailableError: As `sign`.
            KeyMaterialError: As `sign`, for any one of the messages.
        """
        if len(messages) < 2:
            return [self.sign(m) for m in messages]
        checks: list[concurrent.futures.Future[bytes]] = []
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="modelsec-pkcs11-check") as pool:
            try:
                for message in messages:
                    checks.append(pool.submit(self._checked, *self._token_sign(message)))
            except BaseException:
                for check in checks:
                    check.cancel()
                raise
            return [check.result() for check in checks]

    def _token_sign(self, message: bytes) -> tuple[bytes, bytes]:
        """The token's signature of `message` (low-S DER, not checked yet) and the digest it signed.

        Raises:
            BackendUnavailableError, KeyMaterialError: As `sign` (not the check).
        """
        digest = hashlib.new(self._digest_name, message).digest()
        exceptions = self._p11.exceptions
        gone = (
            exceptions.DeviceRemoved,
            exceptions.TokenNotPresent,
            exceptions.TokenNotRecognised,
            exceptions.SessionClosed,
            exceptions.SessionHandleInvalid,
            exceptions.DeviceError,
            exceptions.ObjectHandleInvalid,  # SoftHSM2, its token deleted under an open session
            exceptions.KeyHandleInvalid,
        )
        try:
            with self._login.lock:
                raw = self._key.sign(digest, mechanism=self._p11.Mechanism.ECDSA)
        except gone as e:
            with _LOGINS_LOCK:  # the next open logs in afresh
                if _LOGINS.get(self._login.slot) is self._login:
                    del _LOGINS[self._login.slot]
            raise BackendUnavailableError(
                f"{self._where}: the token or its key is gone (removed?): {_why(e)}"
            ) from e
        except self._p11.PKCS11Error as e:
            raise KeyMaterialError(f"{self._where}: the token refused to sign: {_why(e)}") from e
        size = _coordinate_bytes(self._scheme)
        order = self._scheme.order
        r, s = int.from_bytes(raw[:size], "big"), int.from_bytes(raw[size:], "big")
        if len(raw) != 2 * size or not (0 < r < order and 0 < s < order):
            raise KeyMaterialError(f"{self._where}: the token returned a malformed ECDSA signature")
        # The same low-S form the PEM backend emits (see modelsec.signer.schemes.ecdsa).
        return encode_signature(r, min(s, order - s)), digest

    def _checked(self, signature: bytes, digest: bytes) -> bytes:
        """`signature` once it verifies over `digest` under the public key object.

        Raises:
            KeyMaterialError: It does not (the private and public objects do not belong together).
        """
        try:
            # The digest the token signed, checked as it is (one hash of the message per signature), by the
            # public key decoded once per key: one OpenSSL verification and no other work per signature.
            self._public.verify(signature, digest, self._check_algorithm)
        except InvalidSignature:
            raise KeyMaterialError(
                f"{self._where}: the token's signature does not verify under its public key object "
                "(the private and public objects do not belong together)"
            ) from None
        return signature
