"""The ErrorInfo a failed RPC carries: the public class name, bounded metadata."""

from __future__ import annotations

import pytest

from modelsec import errors
from modelsec.service.status import DOMAIN, ERROR_CLASSES, error_info


class _PrivateError(errors.AttestationError):
    """A subclass no client knows: the nearest public class is named instead."""


@pytest.mark.parametrize("cls", sorted(ERROR_CLASSES.values(), key=lambda c: c.__name__))
def test_every_public_class_names_itself(cls: type[errors.Error]) -> None:
    instance = cls("p", "a", "b") if cls is errors.DigestMismatchError else cls.__new__(cls)
    info = error_info(instance)
    assert (info["reason"], info["domain"]) == (cls.__name__, DOMAIN)
    assert info["metadata"]["retryable"] == ("true" if cls.retryable else "false")


def test_a_private_subclass_is_sent_as_its_public_base() -> None:
    assert error_info(_PrivateError("x"))["reason"] == "AttestationError"


def test_metadata_is_bounded() -> None:
    info = error_info(errors.DigestMismatchError("p" * 100_000, "a", "b"))
    assert len(info["metadata"]["path"]) == 1024
    info = error_info(errors.FileSetMismatchError("m", ["x" * 5000], ["y"] * 10_000))
    assert info["metadata"]["extra"] == "[]" and len(info["metadata"]["missing"]) <= 1024
