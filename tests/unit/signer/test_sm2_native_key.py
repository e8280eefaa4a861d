"""The OpenSSL SM2 backend keeps a private key's EVP_PKEY for the key's lifetime (issue 20)."""

from __future__ import annotations

import gc
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from modelsec.errors import BackendUnavailableError, SignatureError, UnsupportedAlgorithmError
from modelsec.signer.keys import load_private_key
from modelsec.signer.schemes.sm2 import _openssl as _sm2_openssl
from modelsec.signer.schemes.sm2 import api as sm2
from modelsec.signer.schemes.sm2.api import Sm2PrivateKey

D1 = 0x6B2A4E5D1F0C3B8A79E6D5C4B3A29180F7E6D5C4B3A291807F6E5D4C3B2A1908


class _CountingLib:
    """Delegates to libcrypto and records private-key decodes and EVP_PKEY_free calls."""

    def __init__(self, lib: object) -> None:
        self._real = lib
        self.decoded: list[int] = []
        self.freed: list[int] = []
        self.freed_contexts = 0

    def __getattr__(self, name: str) -> object:
        real = getattr(self._real, name)
        if name == "d2i_AutoPrivateKey":

            def decode(*args: object) -> int:
                pkey = real(*args)
                self.decoded.append(int(pkey))
                return pkey

            return decode
        if name == "EVP_MD_CTX_free":

            def free_ctx(mctx: int | None) -> None:
                self.freed_contexts += 1
                real(mctx)

            return free_ctx
        if name == "EVP_PKEY_free":

            def free(pkey: int | None) -> None:
                self.freed.append(int(pkey or 0))
                real(pkey)

            return free
        return real


@pytest.fixture
def counted() -> tuple[_sm2_openssl.OpenSslSm2Backend, _CountingLib]:
    backend = _sm2_openssl.OpenSslSm2Backend()
    lib = _CountingLib(backend._lib)
    backend._lib = lib
    return backend, lib


def test_private_key_is_decoded_once_and_freed_with_the_key(
    counted: tuple[_sm2_openssl.OpenSslSm2Backend, _CountingLib],
) -> None:
    backend, lib = counted
    key = Sm2PrivateKey(D1)
    public = key.public_key
    signatures = [backend.sign(key, b"message %d" % i) for i in range(5)]
    for i, signature in enumerate(signatures):
        backend.verify(public, b"message %d" % i, signature)
    assert len(lib.decoded) == 1  # one decode for five signatures (it was one per signature)
    pkey = lib.decoded[0]
    assert pkey not in lib.freed
    contexts_before = lib.freed_contexts  # verification contexts are freed per call
    del key
    gc.collect()
    assert lib.freed.count(pkey) == 1
    assert lib.freed_contexts == contexts_before + 1  # this thread's signing context went with the key


def test_drop_native_keys_frees_and_signing_still_works(
    counted: tuple[_sm2_openssl.OpenSslSm2Backend, _CountingLib],
) -> None:
    backend, lib = counted
    key = Sm2PrivateKey(D1)
    backend.sign(key, b"m")
    key.drop_native_keys()
    gc.collect()
    assert lib.freed.count(lib.decoded[0]) == 1
    backend.verify(key.public_key, b"m", backend.sign(key, b"m"))
    assert len(lib.decoded) == 2


def test_one_key_signs_from_many_threads() -> None:
    backend = sm2.backend_by_name("openssl")
    key = Sm2PrivateKey(D1)

    def work(i: int) -> int:
        for j in range(20):
            message = b"%d/%d" % (i, j)
            backend.verify(key.public_key, message, backend.sign(key, message))
        return i

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert sorted(pool.map(work, range(8))) == list(range(8))


def test_native_key_is_per_backend_and_loaded_once() -> None:
    key = Sm2PrivateKey(D1)
    calls: list[str] = []

    def loader(value: str) -> list[str]:
        calls.append(value)
        return [value]

    first = key.native_key("a", lambda: loader("a"))
    assert key.native_key("a", lambda: loader("again")) is first
    assert key.native_key("b", lambda: loader("b")) == ["b"]
    assert calls == ["a", "b"]
    assert "native" not in repr(key)


def test_reused_contexts_keep_the_distinguishing_id(tmp_path: Path) -> None:
    """The second and later signatures of a thread re-initialise its contexts: the ID must still be set."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    backend = _sm2_openssl.OpenSslSm2Backend()
    key = Sm2PrivateKey(D1)
    (tmp_path / "pub.pem").write_bytes(key.public_key.to_pem())
    verify = ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(tmp_path / "pub.pem"), "-rawin"]
    verify += ["-digest", "sm3", "-in", str(tmp_path / "msg"), "-sigfile", str(tmp_path / "sig")]
    for i in range(3):
        message = b"message %d" % i
        (tmp_path / "msg").write_bytes(message)
        (tmp_path / "sig").write_bytes(backend.sign(key, message))
        with_id = subprocess.run([*verify, "-pkeyopt", "distid:1234567812345678"], capture_output=True)
        assert b"Signature Verified Successfully" in with_id.stdout, (i, with_id.stderr)
        assert subprocess.run(verify, capture_output=True).returncode != 0  # OpenSSL's default: empty ID


def test_changing_the_id_on_one_thread() -> None:
    backend = sm2.backend_by_name("openssl")
    key = Sm2PrivateKey(D1)
    for distid in (b"1234567812345678", b"alice@example", b"1234567812345678", b""):
        signature = backend.sign(key, b"m", distid)
        backend.verify(key.public_key, b"m", signature, distid)
        with pytest.raises(SignatureError):
            backend.verify(key.public_key, b"m", signature, distid + b"x")


def test_an_invalid_id_is_refused_on_a_thread_that_has_contexts() -> None:
    """The ID is checked when a context is built; a thread's existing context never lets a bad one through."""
    backend = sm2.backend_by_name("openssl")
    key = Sm2PrivateKey(D1)
    backend.sign(key, b"m")
    for bad in (b"x" * 8191, "1234567812345678"):
        with pytest.raises(UnsupportedAlgorithmError):
            backend.sign(key, b"m", bad)  # type: ignore[arg-type]
    signature = backend.sign(key, b"m", bytearray(sm2.DEFAULT_DISTID))  # type: ignore[arg-type]
    backend.verify(key.public_key, b"m", signature)


class _CorruptingLib(_CountingLib):
    """Delegates to libcrypto; `EVP_DigestSign` writes a SET tag where DER `SEQUENCE { r, s }` begins."""

    def __getattr__(self, name: str) -> object:
        real = getattr(self._real, name)
        if name != "EVP_DigestSign":
            return real

        def corrupt(mctx: object, out: Any, *args: object) -> int:
            rc = int(real(mctx, out, *args))
            out[0] = 0x31
            return rc

        return corrupt


def test_a_new_context_first_signature_is_decoded_strictly() -> None:
    backend = _sm2_openssl.OpenSslSm2Backend()
    key = Sm2PrivateKey(D1)
    real = backend._lib
    backend._lib = _CorruptingLib(real)
    with pytest.raises(BackendUnavailableError, match="malformed SM2 signature"):
        backend.sign(key, b"m")
    backend._lib = real
    backend.verify(key.public_key, b"m", backend.sign(key, b"m"))  # the refused context was not kept


def test_a_loaded_key_keeps_the_backend_of_its_first_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    pem = Sm2PrivateKey(D1).to_pem()
    monkeypatch.setenv(sm2.BACKEND_ENV, "gmssl")
    signer = load_private_key(pem, name="k")
    first = signer.sign(b"m")  # gmssl's nonce is deterministic (RFC 6979 with HMAC-SM3), OpenSSL's is not
    monkeypatch.setenv(sm2.BACKEND_ENV, "openssl")
    assert signer.sign(b"m") == first
    again = load_private_key(pem, name="k")
    assert again.sign(b"m") != again.sign(b"m")
