"""The runtime guard in every process: real interpreters started with only `MODELSEC_POLICY` in their
environment (subprocess, multiprocessing spawn / forkserver, torchrun workers, the vLLM plugin) refuse a
tampered shard and load the signed one, through the `.pth` hook the package installs (no code changes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelsec.signer import load_private_key_file, sign_model
from tests.conftest import write_tiny_model

pytestmark = pytest.mark.integration
pytest.importorskip("torch")
SHARD = "model-00002-of-00002.safetensors"
LOAD = """
import safetensors.torch, sys
from modelsec.verifier.guard import hook
for path in sys.argv[1:]:
    print("installed", hook.installed(), flush=True)
    print("loaded", len(safetensors.torch.load_file(path)), flush=True)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, Path, Path]:
    """A signed tiny model, a copy with a flipped byte in a tensor of SHARD, and a policy trusting the key."""
    root = tmp_path_factory.mktemp("guard").resolve()
    good = write_tiny_model(root / "models" / "good")
    sign_model(good, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    bad = root / "models" / "bad"
    shutil.copytree(good, bad)
    data = bytearray((bad / SHARD).read_bytes())
    data[-3] ^= 0x01  # inside the last tensor's bytes
    (bad / SHARD).write_bytes(bytes(data))
    policy = root / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: test\n    match: ['file://{root / 'models'}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n"
    )
    return good / SHARD, bad / SHARD, policy


def environ(**extra: str) -> dict[str, str]:
    """This process's environment without any MODELSEC_* variable, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MODELSEC_")}, **extra}


def imported(*top: str) -> str:
    """Code that prints which of the `top` packages the interpreter has imported."""
    return f"import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(top)!r}))"


def run(
    args: list[str | Path], env: dict[str, str], cwd: Path, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


@pytest.mark.slow
def test_plain_child_loads_signed_and_refuses_tampered_shard(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    good, bad, policy = models
    out = run([sys.executable, "-c", LOAD, good, bad], environ(MODELSEC_POLICY=str(policy)), tmp_path)
    assert out.stdout.splitlines() == ["installed True", "loaded 3", "installed True"], out.stderr
    assert out.returncode == 1
    assert "modelsec.errors.DigestMismatchError" in out.stderr and SHARD in out.stderr.splitlines()[-1]
    # The guard is the application here: it asks for the audit line of the model it verified on stderr.
    audits = [json.loads(x) for x in out.stderr.splitlines() if x.startswith('{"')]
    assert [a["event"] for a in audits] == ["snapshot"] and audits[0]["rootDigest"].startswith("sha256:")


@pytest.mark.slow
def test_without_the_variable_nothing_is_imported_or_checked(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, bad, _ = models
    code = imported("modelsec", "transformers", "torch")
    for env in (environ(), environ(MODELSEC_POLICY="")):
        out = run([sys.executable, "-c", code], env, tmp_path)
        assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "[]", "")
    out = run([sys.executable, "-c", LOAD, bad], environ(), tmp_path)
    assert out.stdout.splitlines() == ["installed False", "loaded 3"], "no guard: the tampered shard loads"


def test_unusable_policy_exits_before_user_code(models: tuple[Path, Path, Path], tmp_path: Path) -> None:
    marker = tmp_path / "user-code-ran"
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies: []\n")
    for value, reason in (
        ("/nonexistent", "/nonexistent: cannot read the policy file"),
        (str(broken), "policies"),
    ):
        out = run(
            [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], environ(MODELSEC_POLICY=value), tmp_path
        )
        assert out.returncode == 1, out.stderr
        (line,) = out.stderr.splitlines()
        assert line.startswith("modelsec: error: runtime guard not installed: ") and reason in line, line
        assert not marker.exists()


def test_a_fifo_policy_fails_closed_at_startup_without_hanging(tmp_path: Path) -> None:
    """User trial finding 4: `open()` on a FIFO blocked, so every `python -c` with the variable hung."""
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    out = run([sys.executable, "-c", "print(1)"], environ(MODELSEC_POLICY=str(fifo)), tmp_path, timeout=60)
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert out.stderr.splitlines() == [
        f"modelsec: error: runtime guard not installed: {fifo}: the policy file is not a regular file "
        "(a FIFO or pipe)"
    ]


def test_startup_with_the_variable_imports_no_framework(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, policy = models
    code = imported("transformers", "torch", "safetensors")
    out = run([sys.executable, "-c", code], environ(MODELSEC_POLICY=str(policy)), tmp_path)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr


POOL = """
import multiprocessing as mp, os, sys

def load(path):
    import safetensors.torch
    from modelsec.verifier.guard import hook
    try:
        return os.getpid(), hook.installed(), "loaded %d" % len(safetensors.torch.load_file(path))
    except Exception as e:
        return os.getpid(), hook.installed(), "refused %s.%s: %s" % (type(e).__module__, type(e).__name__, e)

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    with ctx.Pool(1) as pool:
        results = pool.map(load, sys.argv[2:])
    print(os.getpid(), file=sys.stderr)
    for pid, installed, outcome in results:
        print(pid != os.getpid(), installed, outcome)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_children_are_guarded(
    models: tuple[Path, Path, Path], tmp_path: Path, method: str
) -> None:
    good, bad, policy = models
    script = tmp_path / "parent.py"
    script.write_text(POOL)
    out = run([sys.executable, script, method, good, bad], environ(MODELSEC_POLICY=str(policy)), tmp_path)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "True True loaded 3"
    assert second.startswith("True True refused modelsec.errors.DigestMismatchError: ") and SHARD in second


TORCHRUN = """
import json, os, sys
import torch, torch.distributed as dist
import safetensors.torch
from modelsec.verifier.guard import hook

torch.set_num_threads(1)
dist.init_process_group("gloo")
outcome = {"rank": dist.get_rank(), "installed": hook.installed()}
outcome["good"] = len(safetensors.torch.load_file(sys.argv[1]))
try:
    safetensors.torch.load_file(sys.argv[2])
    outcome["bad"] = "loaded"
except Exception as e:
    outcome["bad"] = "%s.%s" % (type(e).__module__, type(e).__name__)
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, outcome)
if dist.get_rank() == 0:
    print(json.dumps(gathered))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_workers_are_guarded(models: tuple[Path, Path, Path], tmp_path: Path) -> None:
    good, bad, policy = models
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN)
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    out = run([*args, script, good, bad], environ(MODELSEC_POLICY=str(policy)), tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    gathered = json.loads(out.stdout.strip().splitlines()[-1])
    assert gathered == [
        {"rank": r, "installed": True, "good": 3, "bad": "modelsec.errors.DigestMismatchError"}
        for r in (0, 1)
    ]


VLLM = """
import importlib.metadata, os, sys
import safetensors.torch
from modelsec.verifier.guard import hook

(ep,) = importlib.metadata.entry_points(group="vllm.general_plugins", name="modelsec_guard")
before = hook.installed()
os.environ["MODELSEC_POLICY"] = sys.argv[1]  # as a vLLM launcher would see it; the .pth saw none at start
ep.load()()
print(before, hook.installed(), len(safetensors.torch.load_file(sys.argv[2])), flush=True)
safetensors.torch.load_file(sys.argv[3])
"""


@pytest.mark.slow
def test_vllm_plugin_entry_point_installs_the_guard(models: tuple[Path, Path, Path], tmp_path: Path) -> None:
    good, bad, policy = models
    out = run([sys.executable, "-c", VLLM, policy, good, bad], environ(), tmp_path)
    assert out.stdout.splitlines() == ["False True 3"], out.stderr
    assert out.returncode == 1 and "modelsec.errors.DigestMismatchError" in out.stderr


def test_vllm_plugin_fails_closed(tmp_path: Path) -> None:
    code = (
        "import importlib.metadata, os\n"
        "os.environ['MODELSEC_POLICY'] = '/nonexistent'\n"
        "(ep,) = importlib.metadata.entry_points(group='vllm.general_plugins', name='modelsec_guard')\n"
        "from modelsec.errors import PolicyError\n"
        "try:\n    ep.load()()\nexcept PolicyError as e:\n    print(e.diagnostics())\n"
    )
    out = run([sys.executable, "-c", code], environ(), tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "runtime guard not installed: /nonexistent: cannot read the policy file: No such file or directory"
    )


REMOTE_CODE = """
import os, sys, transformers, transformers.dynamic_module_utils as dynamic
config = transformers.AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)
copy = dynamic.HF_MODULES_CACHE  # the guard's private copy the signed module was imported from
print(type(config).__name__, os.path.isdir(copy), copy, flush=True)
"""


@pytest.mark.slow  # one child that imports transformers (~5 s)
def test_the_remote_code_copy_is_removed_when_the_process_exits(tmp_path: Path, key_dir: Path) -> None:
    pytest.importorskip("transformers")
    model = tmp_path / "models" / "custom"
    model.mkdir(parents=True)
    (model / "configuration_custom.py").write_text(
        "from transformers import PretrainedConfig\n"
        "class CustomConfig(PretrainedConfig):\n"
        "    model_type = 'custom'\n"
    )
    config = {"model_type": "custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    (model / "config.json").write_text(json.dumps(config))
    sign_model(model, [load_private_key_file(key_dir / "ecdsa-p256.key.pem")])
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: modelsec.dev/v1alpha1\nkind: ModelPolicy\npolicies:\n"
        f"  - name: test\n    match: ['file://{tmp_path / 'models'}/**']\n"
        f"    keys: ['{key_dir / 'ecdsa-p256.pub.pem'}']\n    allowRemoteCode: true\n"
    )
    env = environ(MODELSEC_POLICY=str(policy), HF_HUB_OFFLINE="1")
    out = run([sys.executable, "-c", REMOTE_CODE, model], env, tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    name, existed, copy = out.stdout.split()
    assert (name, existed) == ("CustomConfig", "True")
    assert copy.startswith("/dev/shm/modelsec-modules-")  # the default place of the guard's private copies
    assert not os.path.lexists(copy)  # removed when the process exited
