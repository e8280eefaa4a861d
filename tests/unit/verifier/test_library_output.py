"""The library logs through `logging` and never writes to stderr unless the application asks."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from modelsec.policy import Policy
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.audit import AUDIT_LOGGER, enable_stderr_audit


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def test_load_model_writes_nothing_unless_logging_is_configured(
    tiny_model: Path, key_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from modelsec.verifier import load_model

    sign_model(tiny_model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = Policy.from_key_files([key_dir / "ecdsa-p256.pub.pem"])
    audit = logging.getLogger(AUDIT_LOGGER)
    # An application that configured no logging at all (pytest's own capture handler taken away too).
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(audit, "handlers", [])
    monkeypatch.setattr(audit, "level", logging.NOTSET)
    capsys.readouterr()
    load_model(tiny_model, policy)
    assert capsys.readouterr().err == ""
    assert audit.handlers == []  # nothing was installed behind the application's back

    # The record is there for an application that routes it.
    records = _Records()
    audit.addHandler(records)
    audit.setLevel(logging.INFO)
    load_model(tiny_model, policy)
    (line,) = records.lines
    assert line["event"] == "load" and str(line["rootDigest"]).startswith("sha256:")
    assert capsys.readouterr().err == ""


def test_enable_stderr_audit_writes_bare_json_unless_the_application_routes_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = logging.getLogger(AUDIT_LOGGER)
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(audit, "handlers", [])
    enable_stderr_audit()
    enable_stderr_audit()  # idempotent: one handler
    assert len(audit.handlers) == 1
    audit.info('{"event":"x"}')
    assert capsys.readouterr().err == '{"event":"x"}\n'
    # An application that routes the logger keeps its routing.
    monkeypatch.setattr(audit, "handlers", [records := _Records()])
    enable_stderr_audit()
    assert audit.handlers == [records]
