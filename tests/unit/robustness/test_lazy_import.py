"""`import modelsec.robustness` and the gate CLI module must not import torch (fast CLI start)."""

from __future__ import annotations

import subprocess
import sys


def test_package_and_cli_module_do_not_import_torch() -> None:
    code = (
        "import sys, modelsec.robustness as r, modelsec.cli.gate as g\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert r.PREDICATE_TYPE == 'https://modelsec.dev/robustness-gate/v1'\n"
        "assert r.wilson_interval(1, 2)[0] > 0 and 'torch' not in sys.modules\n"
        "assert g.gate.name == 'gate' and 'pgd' in g.gate.commands\n"
        "import modelsec.cli.main\n"
        "assert 'gate' in modelsec.cli.main.main.commands and 'torch' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_unknown_attribute() -> None:
    import modelsec.robustness as r

    try:
        r.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
    assert "run_gate" in dir(r)
