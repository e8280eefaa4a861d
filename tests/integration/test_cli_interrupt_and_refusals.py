"""Ctrl-C exits 130 with one line; `sign` refuses by default what `verify` always refuses (issue 19)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.signer import generate_private_key_pem
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

EXE = shutil.which("modelsec", path=str(Path(sys.executable).parent)) or "modelsec"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    private, public = generate_private_key_pem(SignatureAlgorithm.ECDSA_P256)
    (root / "ci.key.pem").write_bytes(private)
    (root / "ci.pub.pem").write_bytes(public)
    return root


def big_model(root: Path, size: int = 2 * 2**30) -> Path:
    """One safetensors file of `size` zero bytes, sparse on disk (hashing it still reads `size` bytes)."""
    root.mkdir()
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(root / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + size)
    return root


def bytes_read(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def has_open(pid: int, path: str) -> bool:
    """Whether process `pid` holds a descriptor of `path` (its links under /proc/PID/fd)."""
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"{fds}/{name}") == path:
                return True
        except OSError:
            continue
    return False


_RESET_SIGINT_AND_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def interrupt_while_hashing(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start the CLI, send SIGINT once it has read 32 MiB of the model; return its result and its exit time.

    A real process: the signal and the exit status are what is tested."""
    proc = subprocess.Popen(
        # As from a shell: SIGINT at its default. An ignored SIGINT is inherited across exec, and a library
        # that a test before this one ran in the pytest process may have left it ignored. It is reset in a
        # small launcher that then execs the CLI (same pid), not in a `preexec_fn`: that runs Python in a
        # child forked from this multi-threaded process (gRPC's threads among them) and can abort it.
        [sys.executable, "-c", _RESET_SIGINT_AND_EXEC, EXE, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    # rchar counts every read, the interpreter's own imports included: count from when the model file is open,
    # so that the signal lands while the model is hashed (not during start-up, however slow a cold start is).
    model_file = str(Path(str(args[1])).resolve() / "model.safetensors")
    deadline = time.monotonic() + 60
    while proc.poll() is None and not has_open(proc.pid, model_file) and time.monotonic() < deadline:
        time.sleep(0.002)
    start = bytes_read(proc.pid) if proc.poll() is None else 0
    while proc.poll() is None and bytes_read(proc.pid) - start < 32 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.002)
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"finished ({proc.returncode}) before it could be interrupted: {out!r} {err!r}")
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - sent


needs_proc_io = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/io"), reason="needs /proc/PID/io")


@needs_proc_io
def test_ctrl_c_during_digest_exits_130(tmp_path: Path) -> None:
    model = big_model(tmp_path / "big")
    r, took = interrupt_while_hashing("digest", model, "-q")
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == ["modelsec: error: modelsec digest interrupted (Ctrl-C)"]
    assert r.stdout == ""
    assert took < 10


@needs_proc_io
def test_ctrl_c_during_sign_exits_130_and_writes_no_bundle(tmp_path: Path, keys: Path) -> None:
    model = big_model(tmp_path / "big")
    r, _ = interrupt_while_hashing("sign", model, "-q", "--signing-key", keys / "ci.key.pem", "--json")
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["error"]["kind"] == "Interrupted"
    assert not (model / "model.sig").exists()


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pytorch_model.bin", "pickle format"),
        ("sub/optimizer.pt", "pickle format"),
        ("modeling_tiny.py", "remote code"),
    ],
)
def test_sign_refuses_what_verify_refuses_unless_allowed(
    tiny_model: Path, keys: Path, name: str, reason: str
) -> None:
    (tiny_model / name).parent.mkdir(exist_ok=True)
    (tiny_model / name).write_bytes(b"\x80\x04K\x01." if reason == "pickle format" else b"import os\n")
    r = run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem")
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("modelsec: error:")
    assert f"{name} ({reason})" in line and "--allow-unverifiable" in line
    assert not (tiny_model / "model.sig").exists()

    r = run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem", "--allow-unverifiable")
    assert r.returncode == 0, r.stderr
    assert (tiny_model / "model.sig").is_file()
    # The override signs, but the default policy still refuses the model: the refusal was not a guess.
    r = run("verify", tiny_model, "-q", "--trusted-key", keys / "ci.pub.pem")
    assert r.returncode == 1 and (
        "pickle" in r.stderr if reason == "pickle format" else "remote code" in r.stderr
    )
    if reason == "remote code":
        assert (
            run("verify", tiny_model, "-q", "--trusted-key", keys / "ci.pub.pem",
                "--allow-remote-code").returncode == 0
        )


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("config.json", '{"auto_map": {"AutoModel": "m.M"}}'),
        ("config.json", "garbage {"),
        ("config.json", '{"x": NaN}'),
        ("config.json", '{"a":1,"a":2}'),
        ("sub/tokenizer_config.json", '{"custom_pipelines": {"x": {"impl": "p.P"}}}'),
        ("model.safetensors.index.json", '{"metadata": {}}'),
        ("model.safetensors.index.json", '{"weight_map": {"w": "../other/model.safetensors"}}'),
        ("model.safetensors.index.json", '{"weight_map": {"ghost": "model-00001-of-00002.safetensors"}}'),
    ],
    ids=[
        "auto_map",
        "syntax",
        "nan",
        "duplicate-key",
        "nested-custom-pipelines",
        "index-without-weight-map",
        "index-target-not-a-shard",
        "index-tensor-not-in-shard",
    ],
)
def test_sign_refuses_json_side_files_verify_refuses(
    tiny_model: Path, keys: Path, name: str, content: str
) -> None:
    """User trial 5: sign refuses with verify's reason; --allow-unverifiable signs, verify still refuses."""
    (tiny_model / name).parent.mkdir(exist_ok=True)
    (tiny_model / name).write_text(content)
    r = run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem")
    assert r.returncode == 1, r.stderr
    refusal = r.stderr.strip()
    assert len(refusal.splitlines()) == 1 and "--allow-unverifiable" in refusal
    assert not (tiny_model / "model.sig").exists()

    r = run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem", "--allow-unverifiable")
    assert r.returncode == 0, r.stderr
    r = run("verify", tiny_model, "-q", "--trusted-key", keys / "ci.pub.pem")
    assert r.returncode == 1
    reason = r.stderr.strip()
    assert reason.startswith("modelsec: error: ") and f"/{name}: " in reason
    # The same words: sign's refusal is verify's, followed by the advice.
    assert refusal.startswith(reason + " (")


def test_allow_unverifiable_help_lists_what_it_covers() -> None:
    # The list is the man page's (`sign --help` is short: issue 31); the committed page is kept current.
    page = Path(__file__).resolve().parents[2] / "docs" / "man" / "modelsec-sign.1"
    text = " ".join(page.read_text().replace("\\-", "-").split())
    assert "man modelsec-sign" in run("sign", "--help").stdout
    covers = (
        "pickle",
        "*.py",
        "auto_map",
        "custom_pipelines",
        "duplicate keys",
        "NaN",
        "size limit",
        "weight_map",
    )
    for covered in covers:
        assert covered in text, covered


def test_sign_accepts_a_plain_safetensors_model(tiny_model: Path, keys: Path) -> None:
    assert run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem").returncode == 0
    assert run("verify", tiny_model, "-q", "--trusted-key", keys / "ci.pub.pem").returncode == 0


def test_verify_of_a_shard_the_manifest_does_not_list_says_so(tiny_model: Path, keys: Path) -> None:
    assert run("sign", tiny_model, "-q", "--signing-key", keys / "ci.key.pem").returncode == 0
    r = run("verify", tiny_model, "--trusted-key", keys / "ci.pub.pem", "--shard", "nonexist.safetensors")
    assert r.returncode == 1
    assert "not signed files of this model: nonexist.safetensors" in r.stderr
    assert "extra (unsigned)" not in r.stderr  # the directory does not hold it: not an "extra" file


def test_a_pem_file_as_watermark_key_is_named_as_such(tiny_model: Path, keys: Path) -> None:
    r = run("watermark", "detect", tiny_model, "--watermark-key", keys / "ci.key.pem", "-m", "hi")
    assert r.returncode == 1
    assert "is a PEM file" in r.stderr and "not a watermark key" in r.stderr and "too long" not in r.stderr
