"""SM2 backend on the system OpenSSL >= 3.0 `libcrypto`, bound with `ctypes` (the default backend).

OpenSSL computes `Z_A`, `e = SM3(Z_A || M)`, the nonce (from its DRBG) and the curve arithmetic
(constant-time, `crypto/sm2/sm2_sign.c`). modelsec sets the distinguishing ID explicitly on every operation,
because OpenSSL 3 otherwise uses an empty ID (`EVP_PKEY-SM2(7)`), and decodes every signature with
`decode_sm2_signature` before OpenSSL sees it.

The binding follows the documented SM2 recipe of `EVP_PKEY-SM2(7)`:
`EVP_PKEY_CTX_new(pkey)` → `EVP_PKEY_CTX_set1_id(pctx, id, len)` (a real function since 3.0, ctrl
`EVP_PKEY_CTRL_SET1_ID` = 15) → `EVP_MD_CTX_set_pkey_ctx(mctx, pctx)` →
`EVP_Digest{Sign,Verify}Init(mctx, NULL, EVP_sm3(), NULL, pkey)` → `EVP_Digest{Sign,Verify}`. The
`EVP_PKEY_CTX` stays owned by the caller (`EVP_MD_CTX_set_pkey_ctx` sets `EVP_MD_CTX_FLAG_KEEP_PKEY_CTX`), so
it is freed after the `EVP_MD_CTX`. Every context is freed in `finally`, and the thread's OpenSSL error queue
is cleared after each call so that failures do not leak into other users of the library. `ctypes` releases
the GIL during the calls; each call uses its own contexts, so the backend is thread-safe.

Decoding a key costs OpenSSL 3 about as much as a signature, so decoded keys are kept: a private key's
`EVP_PKEY` lives with its `Sm2PrivateKey` (`Sm2PrivateKey.native_key`) and is freed when that key is
garbage-collected; public keys sit in a small LRU cache. An `EVP_PKEY` is only read after decoding, which
OpenSSL allows from several threads at once.

The backend self-tests on construction (GB/T 32918.5-2017 annex A) and raises `BackendUnavailableError`
if libcrypto is missing, older than 3.0, lacks SM2/SM3, or fails the test.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections import OrderedDict
from collections.abc import Callable
from ctypes import c_size_t, c_void_p
from typing import Final

from modelsec.errors import BackendUnavailableError, SignatureError
from modelsec.signer.schemes.sm2._backend import _self_test
from modelsec.signer.schemes.sm2._core import DEFAULT_DISTID, check_distid, decode_sm2_signature
from modelsec.signer.schemes.sm2._keys import Sm2PrivateKey, Sm2PublicKey
from modelsec.signer.schemes.sm2._libcrypto import load_libcrypto

__all__ = ["OpenSslSm2Backend"]

_MAX_SIGNATURE_BYTES: Final = 80  # SEQUENCE of two INTEGERs of at most 33 bytes: 72; OpenSSL reports 72.
_PUBLIC_KEY_CACHE_SIZE: Final = 32  # Decoding an SPKI costs more than the verification itself in OpenSSL 3.0.


class _SignContext:
    """One thread's `(EVP_MD_CTX *, EVP_PKEY_CTX *)` for one key and ID, freed when garbage-collected.

    `EVP_DigestSignInit` on the same `EVP_MD_CTX` starts the next signature, as `openssl speed` does: the
    `EVP_PKEY_CTX` is kept (`EVP_MD_CTX_FLAG_KEEP_PKEY_CTX`) and re-applies its cached distinguishing ID at
    every init (`evp_pkey_ctx_use_cached_data`), so contexts are not rebuilt per signature. The ctypes
    arguments (pointers, output buffer, length) are built once here too: each context belongs to one thread.
    """

    __slots__ = ("_lib", "args", "distid", "mctx", "out", "pctx", "size")

    def __init__(self, lib: ctypes.CDLL, distid: bytes, mctx: int, pctx: int, pkey: int) -> None:
        self._lib, self.distid, self.mctx, self.pctx = lib, distid, mctx, pctx
        self.out = ctypes.create_string_buffer(_MAX_SIGNATURE_BYTES)
        self.size = c_size_t(_MAX_SIGNATURE_BYTES)
        # (mctx, pkey, out, &size) as ctypes objects, so that ctypes converts no Python int per signature.
        self.args = (c_void_p(mctx), c_void_p(pkey), self.out, ctypes.byref(self.size))

    def __del__(self) -> None:
        mctx, pctx, self.mctx, self.pctx = self.mctx, self.pctx, 0, 0
        if mctx:
            self._lib.EVP_MD_CTX_free(mctx)
        if pctx:
            self._lib.EVP_PKEY_CTX_free(pctx)


class _VerifyContext(_SignContext):
    """One thread's verification contexts for one public key and ID, holding its own key reference."""

    __slots__ = ("_pkey",)

    def __init__(self, lib: ctypes.CDLL, distid: bytes, mctx: int, pctx: int, pkey: int) -> None:
        super().__init__(lib, distid, mctx, pctx, pkey)
        self._pkey = pkey  # a reference of this context's own (from `_public_pkey`), freed with it

    def __del__(self) -> None:
        super().__del__()
        pkey, self._pkey = self._pkey, 0
        if pkey:
            self._lib.EVP_PKEY_free(pkey)


class _OwnedPkey:
    """One reference to an `EVP_PKEY *` and its per-thread signing contexts, released when collected."""

    __slots__ = ("_free", "pointer", "threads")

    def __init__(self, pointer: int, free: Callable[[int], None]) -> None:
        self.pointer = pointer
        self._free = free
        # Each thread signs with its own contexts (an EVP_MD_CTX is not thread-safe); a thread's entry is
        # dropped when the thread ends, and all of them when this key is.
        self.threads = threading.local()

    def __del__(self) -> None:
        # Signing contexts hold references of their own to the key (EVP_PKEY_CTX_new up-refs it).
        pointer, self.pointer = self.pointer, 0
        if pointer:
            self._free(pointer)


class OpenSslSm2Backend:
    """SM2/SM3 through OpenSSL 3 EVP (`EVP_PKEY-SM2(7)`), self-tested against GB/T 32918.5-2017 annex A.

    Raises:
        BackendUnavailableError: On construction, when libcrypto >= 3.0 with SM2 is missing or the
            self-test fails (fail closed).
    """

    __slots__ = ("__weakref__", "_cache", "_lib", "_lock", "_sm3", "_verifiers", "_version")

    def __init__(self) -> None:
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        # Per thread: (x, y, distid) -> `_VerifyContext` (an EVP_MD_CTX is not thread-safe).
        self._verifiers = threading.local()
        self._lock = threading.Lock()
        self._lib = load_libcrypto()
        self._sm3 = self._lib.EVP_sm3()
        if not self._sm3:
            raise BackendUnavailableError("OpenSSL libcrypto has no SM3 (EVP_sm3 returned NULL)")
        raw = self._lib.OpenSSL_version(0)
        self._version = raw.decode("ascii", "replace") if isinstance(raw, bytes) else "OpenSSL"
        _self_test(self)

    def __repr__(self) -> str:
        return f"OpenSslSm2Backend({self._version!r})"

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Free the cached public keys (the backend stays usable; the cache refills on demand)."""
        cache = getattr(self, "_cache", None)
        if not cache:
            return
        with self._lock:
            while cache:
                self._lib.EVP_PKEY_free(cache.popitem()[1])

    @property
    def name(self) -> str:
        """`openssl`."""
        return "openssl"

    @property
    def version(self) -> str:
        """The OpenSSL version string, e.g. `OpenSSL 3.0.19 27 Jan 2026`."""
        return self._version

    def _errors(self) -> str:
        """Drain the thread's OpenSSL error queue into one line."""
        messages: list[str] = []
        buf = ctypes.create_string_buffer(256)
        for _ in range(16):
            code = int(self._lib.ERR_get_error())
            if not code:
                break
            self._lib.ERR_error_string_n(code, buf, len(buf))
            messages.append(buf.value.decode("ascii", "replace"))
        self._lib.ERR_clear_error()
        return "; ".join(messages) or "no OpenSSL error reported"

    def _load_key(self, der: bytes, *, private: bool) -> int:
        """Decode DER into a new `EVP_PKEY *` of type SM2; the caller frees it."""
        buf = ctypes.create_string_buffer(der, len(der))
        cursor = c_void_p(ctypes.addressof(buf))
        try:
            decode = self._lib.d2i_AutoPrivateKey if private else self._lib.d2i_PUBKEY
            pkey = decode(None, ctypes.byref(cursor), len(der))
            if not pkey:
                raise BackendUnavailableError(f"OpenSSL cannot decode the SM2 key: {self._errors()}")
            if cursor.value != ctypes.addressof(buf) + len(der) or self._lib.EVP_PKEY_is_a(pkey, b"SM2") != 1:
                self._lib.EVP_PKEY_free(pkey)
                raise BackendUnavailableError("OpenSSL did not decode the key as one whole SM2 key")
            return int(pkey)
        finally:
            ctypes.memset(buf, 0, len(der))

    def _public_pkey(self, public_key: Sm2PublicKey) -> int:
        """Return a new reference to the `EVP_PKEY *` of `public_key`; the caller frees it.

        Decoded keys are kept in a small LRU cache. The cache holds one reference of its own and every
        caller gets another (`EVP_PKEY_up_ref`), so eviction never frees a key that another thread uses.
        Private keys are not cached here: each one keeps its own `EVP_PKEY` (`_private_pkey`).
        """
        lib, key = self._lib, (public_key.x, public_key.y)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                if lib.EVP_PKEY_up_ref(cached) != 1:
                    raise BackendUnavailableError("OpenSSL EVP_PKEY_up_ref failed")
                self._cache.move_to_end(key)
                return cached
        pkey = self._load_key(public_key.to_der(), private=False)
        with self._lock:
            if key not in self._cache and lib.EVP_PKEY_up_ref(pkey) == 1:
                self._cache[key] = pkey
                while len(self._cache) > _PUBLIC_KEY_CACHE_SIZE:
                    lib.EVP_PKEY_free(self._cache.popitem(last=False)[1])
        return pkey

    def _private_pkey(self, private_key: Sm2PrivateKey) -> _OwnedPkey:
        """Return the `EVP_PKEY` of `private_key`, decoded on its first signature and kept with the key."""
        return private_key.native_key(
            self,
            lambda: _OwnedPkey(self._load_key(private_key.to_der(), private=True), self._lib.EVP_PKEY_free),
        )

    def _digest_ctx(self, pkey: int, distid: bytes, *, signing: bool) -> tuple[int, int]:
        """Create `(EVP_MD_CTX *, EVP_PKEY_CTX *)` initialised for SM2 with SM3 and `distid`."""
        lib = self._lib
        mctx = lib.EVP_MD_CTX_new()
        pctx = lib.EVP_PKEY_CTX_new(pkey, None)
        if not mctx or not pctx:
            lib.EVP_MD_CTX_free(mctx)
            lib.EVP_PKEY_CTX_free(pctx)
            raise BackendUnavailableError("OpenSSL could not allocate SM2 contexts")
        try:
            if lib.EVP_PKEY_CTX_set1_id(pctx, distid, len(distid)) != 1:
                raise BackendUnavailableError(f"OpenSSL refused the SM2 distinguishing ID: {self._errors()}")
            lib.EVP_MD_CTX_set_pkey_ctx(mctx, pctx)
            init = lib.EVP_DigestSignInit if signing else lib.EVP_DigestVerifyInit
            if init(mctx, None, self._sm3, None, pkey) != 1:
                raise BackendUnavailableError(f"OpenSSL SM2 {'sign' if signing else 'verify'} init failed")
        except BaseException:
            lib.EVP_MD_CTX_free(mctx)
            lib.EVP_PKEY_CTX_free(pctx)
            raise
        return int(mctx), int(pctx)

    def sign(self, private_key: Sm2PrivateKey, message: bytes, distid: bytes = DEFAULT_DISTID) -> bytes:
        """Sign the raw message with OpenSSL (nonce from OpenSSL's DRBG).

        Args:
            private_key: The signing key.
            message: The raw message `M`.
            distid: The signer's distinguishing ID.

        Returns:
            DER `SEQUENCE { r, s }` (the first one per key, thread and ID checked with
            `decode_sm2_signature`; see the comment in the code for the others).

        Raises:
            UnsupportedAlgorithmError: `distid` cannot be encoded.
            BackendUnavailableError: OpenSSL failed to sign.
        """
        lib = self._lib
        owned = self._private_pkey(private_key)
        threads = owned.threads
        try:
            ctx: _SignContext | None = getattr(threads, "sign", None)
            fresh = ctx is None or ctx.distid != distid
            if ctx is None or fresh:
                # A context's ID was checked when it was built, so only a new context checks one.
                check_distid(distid)
                threads.sign = None
                distid = bytes(distid)
                mctx, pctx = self._digest_ctx(owned.pointer, distid, signing=True)
                ctx = _SignContext(lib, distid, mctx, pctx, owned.pointer)
                threads.sign = ctx
            mctx_arg, pkey_arg, out, size_ref = ctx.args
            if not fresh and lib.EVP_DigestSignInit(mctx_arg, None, self._sm3, None, pkey_arg) != 1:
                threads.sign = None
                raise BackendUnavailableError(f"OpenSSL SM2 sign init failed: {self._errors()}")
            ctx.size.value = _MAX_SIGNATURE_BYTES
            data = bytes(message)
            if lib.EVP_DigestSign(mctx_arg, out, size_ref, data, len(data)) != 1:
                threads.sign = None  # start the next signature from new contexts
                raise BackendUnavailableError(f"OpenSSL SM2 signing failed: {self._errors()}")
            signature = out.raw[: ctx.size.value]
        finally:
            lib.ERR_clear_error()
        if fresh:
            # The first signature of every new context is decoded strictly. The others are not re-parsed:
            # OpenSSL's sm2_sig_gen (crypto/sm2/sm2_sign.c) draws again until r != 0, r + k != n and
            # s != 0, so r, s lie in [1, n-1] and (r + s) mod n = (r + k)(1 + d)^-1 mod n != 0, and
            # i2d_ECDSA_SIG writes them as DER; the self-test decodes a fresh signature before the backend
            # is used at all, and the first one of each key, thread and ID is decoded here.
            try:
                decode_sm2_signature(signature)
            except SignatureError as e:
                threads.sign = None
                raise BackendUnavailableError("OpenSSL produced a malformed SM2 signature") from e
        return signature

    def verify(
        self, public_key: Sm2PublicKey, message: bytes, signature: bytes, distid: bytes = DEFAULT_DISTID
    ) -> None:
        """Verify a DER signature over the raw message with OpenSSL.

        `decode_sm2_signature` runs first (strict DER, r, s in [1, n-1], (r + s) mod n != 0).

        Args:
            public_key: The trusted public key.
            message: The raw message `M`.
            signature: DER `SEQUENCE { r, s }`.
            distid: The signer's distinguishing ID.

        Raises:
            SignatureError: On any failure (including a binding or OpenSSL error).
        """
        decode_sm2_signature(signature)
        try:
            check_distid(distid)
            valid = self._verify(public_key, bytes(message), bytes(signature), bytes(distid))
        except SignatureError:
            raise
        except Exception as e:  # Verification fails closed on *any* error.
            raise SignatureError(f"SM2 signature verification failed ({type(e).__name__}: {e})") from e
        if not valid:
            raise SignatureError("SM2 signature verification failed")

    def _verify(self, public_key: Sm2PublicKey, message: bytes, signature: bytes, distid: bytes) -> bool:
        # As `sign`, and as `openssl speed` verifies: the thread's contexts for this key and ID are kept,
        # and `EVP_DigestVerifyInit` on the same EVP_MD_CTX starts each verification (the kept EVP_PKEY_CTX
        # re-applies the ID). Any failure drops them, so the next verification starts from new ones.
        lib = self._lib
        contexts: dict[tuple[int, int, bytes], _VerifyContext] | None = getattr(self._verifiers, "map", None)
        if contexts is None:
            contexts = self._verifiers.map = {}
        key = (public_key.x, public_key.y, distid)
        ctx = contexts.pop(key, None)
        try:
            if ctx is None:
                if len(contexts) >= _PUBLIC_KEY_CACHE_SIZE:
                    contexts.clear()
                pkey = self._public_pkey(public_key)
                try:
                    mctx, pctx = self._digest_ctx(pkey, distid, signing=False)
                except BaseException:
                    lib.EVP_PKEY_free(pkey)
                    raise
                ctx = _VerifyContext(lib, distid, mctx, pctx, pkey)
            elif lib.EVP_DigestVerifyInit(ctx.args[0], None, self._sm3, None, ctx.args[1]) != 1:
                raise BackendUnavailableError(f"OpenSSL SM2 verify init failed: {self._errors()}")
            rc = lib.EVP_DigestVerify(ctx.args[0], signature, len(signature), message, len(message))
            if int(rc) >= 0:
                contexts[key] = ctx  # kept for the next verification (dropped after an error)
        finally:
            lib.ERR_clear_error()
        # 1 is valid; 0 is a bad signature; a negative value is an error. Only exactly 1 is accepted.
        return int(rc) == 1
