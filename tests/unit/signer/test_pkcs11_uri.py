"""RFC 7512 `pkcs11:` URIs as key references: strict parsing, and PINs never taken from the URI itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelsec.errors import KeyMaterialError
from modelsec.signer.keys import PemFileKeySource, key_source
from modelsec.signer.pkcs11 import Pkcs11KeySource, parse_pkcs11_uri

_MODULE = "module-path=/usr/lib/softhsm/libsofthsm2.so"


def test_parses_path_and_query_attributes_percent_decoded() -> None:
    uri = parse_pkcs11_uri(
        f"pkcs11:token=CI%20Token;serial=58e1;slot-id=7;object=rel%3Bease;id=%01%FF;type=private?{_MODULE}"
        "&pin-source=file:/run/secrets/pin"
    )
    assert (uri.token, uri.serial, uri.slot_id, uri.object, uri.id) == (
        "CI Token",
        "58e1",
        7,
        "rel;ease",
        b"\x01\xff",
    )
    assert uri.module_path == "/usr/lib/softhsm/libsofthsm2.so"
    assert uri.pin_source == "file:/run/secrets/pin"
    assert "pin" not in repr(uri)  # the PIN's location stays out of logs too


def test_key_source_dispatches_on_the_uri_scheme(tmp_path: Path) -> None:
    source = key_source(f"PKCS11:object=release?{_MODULE}")
    assert isinstance(source, Pkcs11KeySource)
    assert source.reference == "pkcs11:object=release"
    assert isinstance(key_source(tmp_path / "ci.key.pem"), PemFileKeySource)
    assert isinstance(key_source("pkcs11-keys/ci.key.pem"), PemFileKeySource)  # a path, not a URI


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        (f"pkcs11:object=k?{_MODULE}&pin-value=4711", "pin-value is refused: a PIN in the URI"),
        ("pkcs11:object=k?module-name=softhsm2", "module-name is refused"),
        (f"pkcs11:object=k;object=j?{_MODULE}", "'object' is given twice"),
        (f"pkcs11:object=k;library-version=1?{_MODULE}", "'library-version' is not supported"),
        (f"pkcs11:object=k?{_MODULE}&x-vendor=1", "'x-vendor' is not supported"),
        (f"pkcs11:object=k;type=public?{_MODULE}", "type=public cannot sign"),
        (f"pkcs11:token=ci?{_MODULE}", "name the key with object=LABEL or id="),
        ("pkcs11:object=k", "module-path=/path/to/pkcs11-module.so is required"),
        (f"pkcs11:object=%zz?{_MODULE}", "'object' has a malformed percent-encoding"),
        (f"pkcs11:object=%ff?{_MODULE}", "'object' is not UTF-8"),
        (f"pkcs11:object=k;slot-id=x?{_MODULE}", "slot-id must be a decimal number"),
        (f"pkcs11:object=?{_MODULE}", "without a value"),
    ],
)
def test_malformed_uris_are_refused_naming_the_attribute(uri: str, message: str) -> None:
    with pytest.raises(KeyMaterialError, match=message) as caught:
        key_source(uri)
    assert "4711" not in str(caught.value)  # a PIN typed into the URI is never echoed


@pytest.mark.parametrize(
    ("pin_source", "message"),
    [
        ("4711", "pin-source must be file:PATH or env:VAR"),
        ("env:MODELSEC_TEST_NO_SUCH_PIN_VAR", r"\$MODELSEC_TEST_NO_SUCH_PIN_VAR is not set or empty"),
        ("file:/nonexistent/pin", "cannot read the PIN file /nonexistent/pin"),
    ],
)
def test_pin_sources_other_than_a_file_or_variable_are_refused(pin_source: str, message: str) -> None:
    pytest.importorskip("pkcs11", reason="python-pkcs11 is not installed (pip install 'modelsec[pkcs11]')")
    source = key_source(f"pkcs11:object=k?{_MODULE}&pin-source={pin_source}")
    with pytest.raises(KeyMaterialError, match=message) as caught:
        source.open()  # the PIN is read before the module is loaded
    assert "4711" not in str(caught.value)


def test_a_pin_from_the_uri_and_from_the_caller_is_ambiguous(tmp_path: Path) -> None:
    pytest.importorskip("pkcs11", reason="python-pkcs11 is not installed (pip install 'modelsec[pkcs11]')")
    (tmp_path / "pin").write_text("1234\n")
    source = key_source(f"pkcs11:object=k?{_MODULE}&pin-source=file:{tmp_path / 'pin'}")
    with pytest.raises(KeyMaterialError, match="pin-source and a PIN was given as well"):
        source.open(password=b"1234")
    with pytest.raises(KeyMaterialError, match="no PIN: add pin-source"):
        key_source(f"pkcs11:object=k?{_MODULE}").open()
