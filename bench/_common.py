"""Shared helpers of the modelsec benchmarks: test models, reference hashing, timed subprocesses, tables.

Plain Python + subprocess (no pytest, no modelsec imports at module level), so the helpers also measure
other tools on the same files.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

GIB = 2**30
MIB = 2**20
GENERATOR_VERSION = 1  # bump when the generated layout changes, so cached models are rebuilt

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------------------
# Machine


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cpus() -> int:
    """CPUs this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> str:
    """The 1/5/15-minute load average as text."""
    try:
        return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "n/a"


def tool_version(argv: Sequence[str]) -> str:
    """First line of a tool's version output, or 'missing'."""
    if shutil.which(argv[0]) is None:
        return "missing"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "error"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"


def package_version(name: str) -> str:
    """Installed distribution version, or 'missing'."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def machine_lines() -> list[str]:
    """Lines describing the machine and the software measured."""
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return [
        f"cpu: {cpu_model()}; nproc {usable_cpus()} (os.cpu_count {os.cpu_count()}); memory {mem}",
        f"python {platform.python_version()} ({sys.executable}); {platform.platform()}",
        f"hashlib OpenSSL: {ssl.OPENSSL_VERSION}; openssl CLI: {tool_version(['openssl', 'version'])}",
        "modelsec {}, model-signing {}, blake3 {}, safetensors {}, cryptography {}".format(
            package_version("modelsec"),
            package_version("model-signing"),
            package_version("blake3"),
            package_version("safetensors"),
            package_version("cryptography"),
        ),
    ]


# --------------------------------------------------------------------------------------------------------
# Test models


@dataclass(frozen=True)
class ModelSpec:
    """A generated model: `shards` safetensors files of about `size_bytes` in total, plus side files."""

    size_bytes: int
    shards: int
    seed: int = 0
    side_files: bool = True  # config.json, tokenizer.json (+ index when sharded); False: weights only

    @property
    def dirname(self) -> str:
        kind = "model" if self.side_files else "weights"
        return f"{kind}-{self.size_bytes / GIB:.3f}GiB-{self.shards}shards-s{self.seed}"

    def shard_name(self, i: int) -> str:
        if self.shards == 1:
            return "model.safetensors"
        return f"model-{i + 1:05d}-of-{self.shards:05d}.safetensors"


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 2 if dtype == "BF16" else 4
    for d in shape:
        n *= d
    return n


def _random_tensor(gen: torch.Generator, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """Random bits as a torch tensor of `dtype` ("BF16" or "F32"); NaN patterns are fine for hashing."""
    import torch

    tdtype = {"BF16": torch.bfloat16, "F32": torch.float32}[dtype]
    nbytes = _nbytes(shape, dtype)
    words = torch.empty((nbytes + 7) // 8, dtype=torch.int64)
    words.random_(generator=gen)
    return words.view(torch.uint8)[:nbytes].view(tdtype).reshape(shape).clone()


def _shard_layout(shard_bytes: int, shard_index: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Tensor names, shapes and dtypes of one shard: transformer-like layers until `shard_bytes` is filled."""
    h = 2048 if shard_bytes >= 512 * MIB else 1024
    layer: list[tuple[str, tuple[int, ...], str]] = [
        ("input_layernorm.weight", (h,), "F32"),
        ("self_attn.q_proj.weight", (h, h), "BF16"),
        ("self_attn.q_proj.bias", (h,), "F32"),
        ("self_attn.k_proj.weight", (h, h), "BF16"),
        ("self_attn.v_proj.weight", (h, h), "BF16"),
        ("self_attn.o_proj.weight", (h, h), "BF16"),
        ("post_attention_layernorm.weight", (h,), "F32"),
        ("mlp.up_proj.weight", (4 * h, h), "BF16"),
        ("mlp.down_proj.weight", (h, 4 * h), "BF16"),
    ]
    out: list[tuple[str, tuple[int, ...], str]] = []
    used, li = 0, 0
    while used < shard_bytes:
        for name, shape, dtype in layer:
            size = _nbytes(shape, dtype)
            remaining = shard_bytes - used
            if remaining <= 0:
                break
            if size > remaining:  # last tensor of the shard: a 1-D BF16 tail that fills the target size
                shape, dtype, size = (max(1, remaining // 2),), "BF16", 2 * max(1, remaining // 2)
            out.append((f"model.layers.{shard_index}.{li}.{name}", shape, dtype))
            used += size
        li += 1
    return out


def ensure_model(root: Path, spec: ModelSpec, log: Callable[[str], None] = print) -> Path:
    """Create (once) the model described by `spec` under `root` and return its directory.

    A marker file beside the model directory (never inside it: it would become a signed file) records the
    spec; a model without a matching marker is rebuilt.
    """
    model_dir = root / spec.dirname
    marker = root / f"{spec.dirname}.done.json"
    want = {
        "generator": GENERATOR_VERSION,
        "size_bytes": spec.size_bytes,
        "shards": spec.shards,
        "seed": spec.seed,
        "side_files": spec.side_files,
    }
    if marker.exists() and model_dir.is_dir():
        try:
            have = json.loads(marker.read_text())
        except ValueError:
            have = None
        if (
            have
            and have.get("spec") == want
            and all(
                (model_dir / n).is_file() and (model_dir / n).stat().st_size == s
                for n, s in have["files"].items()
            )
        ):
            return model_dir
    import torch
    from safetensors.torch import save_file

    log(f"generating {model_dir} ({spec.size_bytes / GIB:.2f} GiB in {spec.shards} shards) ...")
    t0 = time.perf_counter()
    if model_dir.exists():
        shutil.rmtree(model_dir)
    marker.unlink(missing_ok=True)
    model_dir.mkdir(parents=True)
    gen = torch.Generator().manual_seed(spec.seed)
    weight_map: dict[str, str] = {}
    per_shard = spec.size_bytes // spec.shards
    total = 0
    for i in range(spec.shards):
        tensors: dict[str, torch.Tensor] = {}
        for name, shape, dtype in _shard_layout(per_shard, i):
            tensors[name] = _random_tensor(gen, shape, dtype)
            weight_map[name] = spec.shard_name(i)
            total += tensors[name].numel() * tensors[name].element_size()
        save_file(tensors, str(model_dir / spec.shard_name(i)), metadata={"format": "pt"})
        del tensors
    if spec.shards > 1 and spec.side_files:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if spec.side_files:
        _write_side_files(model_dir, weight_map)
    files = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir())}
    marker.write_text(json.dumps({"spec": want, "files": files}, indent=2) + "\n")
    log(
        f"  done in {time.perf_counter() - t0:.1f} s: {len(files)} files, {sum(files.values()) / GIB:.3f} GiB"
    )
    return model_dir


def _write_side_files(model_dir: Path, weight_map: dict[str, str]) -> None:
    config = {
        "architectures": ["BenchForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": len({k.split(".")[3] for k in weight_map}),
        "torch_dtype": "bfloat16",
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    vocab = {f"tok{i:06d}": i for i in range(50_000)}  # ~1 MB, the size class of a real tokenizer.json
    tokenizer = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer) + "\n")


def model_files(model_dir: Path) -> list[Path]:
    """Regular files of a model directory (flat), largest first."""
    return sorted((p for p in model_dir.iterdir() if p.is_file()), key=lambda p: -p.stat().st_size)


def total_bytes(files: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def warm_page_cache(files: Iterable[Path], chunk: int = 8 * MIB) -> tuple[int, float]:
    """Read every file once (so timed runs read from the page cache). Returns (bytes, seconds)."""
    buf = bytearray(chunk)
    n, t0 = 0, time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------------
# Reference hashing (the limits of this machine, in Python, for a given hash work)


def hash_factory(name: str) -> Callable[[], object]:
    """A zero-argument constructor of an incremental hasher: sha256 | sm3 | blake3 (single-threaded)."""
    if name == "sha256":
        return hashlib.sha256
    if name == "sm3":
        hashlib.new("sm3")  # raises ValueError where OpenSSL lacks SM3
        return lambda: hashlib.new("sm3")
    if name == "blake3":
        import blake3

        return blake3.blake3
    raise ValueError(name)


def reference_hash(files: Sequence[Path], algorithms: Sequence[str], threads: int, chunk: int) -> float:
    """Hash every file with every algorithm in one read pass per file, `threads` files at a time.

    Each thread takes the next file (largest first), reads it into one reused buffer of `chunk` bytes and
    feeds every hasher from that buffer: the minimum work any engine doing this hash work must do. Returns
    the wall time in seconds.
    """
    factories = [hash_factory(a) for a in algorithms]
    order = sorted(files, key=lambda p: -p.stat().st_size)

    def one(path: Path) -> list[bytes]:
        hashers = [f() for f in factories]
        buf = bytearray(chunk)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                data = view[:n] if n < chunk else view
                for h in hashers:
                    h.update(data)  # type: ignore[attr-defined]
        return [h.digest() for h in hashers]  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    if threads <= 1:
        for p in order:
            one(p)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, order))
    return time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------------
# Timed subprocesses


@dataclass
class Run:
    """One timed command: wall seconds, exit code, peak RSS (bytes) and CPU seconds of that child, output."""

    seconds: float
    rc: int
    max_rss: int
    cpu: float
    stdout: str
    stderr: str


# A small launcher process starts the measured command and reports what `os.wait4` says about exactly that
# child. It exists because Linux keeps a process's peak-RSS mark across fork+exec: a command started directly
# by this (large) benchmark process would report at least this process's RSS as its own peak.
_LAUNCHER = """
import os, sys, time
out, argv = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(out, "w") as f:
    rc = os.waitstatus_to_exitcode(status)
    f.write("%r %r %r %r" % (wall, rc, ru.ru_maxrss, ru.ru_utime + ru.ru_stime))
"""


def run_timed(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run `argv`; measure its wall time, CPU time and its own peak RSS (rusage of exactly that child).

    The command is started by a small launcher (`python -S -c`), which times it and reads its rusage from
    `os.wait4`, so neither interpreter start-up of the launcher nor this process's RSS is counted.
    """
    import tempfile

    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".rusage") as rep,
    ):
        proc = subprocess.run(
            [sys.executable, "-S", "-c", _LAUNCHER, rep.name, *argv],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            check=False,
        )
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        fields = rep.read().split()
        if proc.returncode != 0 or len(fields) != 4:
            return Run(float("nan"), proc.returncode or 127, 0, 0.0, stdout, stderr)
        wall, rc, maxrss_kib, cpu = float(fields[0]), int(fields[1]), int(fields[2]), float(fields[3])
        return Run(seconds=wall, rc=rc, max_rss=maxrss_kib * 1024, cpu=cpu, stdout=stdout, stderr=stderr)


def baseline_tree(rev: str, into: Path) -> Path:
    """A directory to put first on PYTHONPATH so that `import modelsec` is revision `rev`'s package.

    The editable install's link tree (`build/__editable__.*/modelsec`: one symlink per source file, laid
    out as the package) is copied with every link pointed from this checkout into `git archive rev`.
    """
    import modelsec

    tree = Path(modelsec.__file__).resolve().parent
    link = Path(modelsec.__file__).parent
    if link == tree:
        raise RuntimeError("--baseline-rev needs the editable install's link tree (make .venv/.test)")
    source = into / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    out = into / "tree"
    shutil.copytree(link.parent, out, symlinks=True)
    for path in out.rglob("*"):
        if path.is_symlink():
            target = Path(os.readlink(path))
            if target.is_relative_to(REPO_ROOT):
                path.unlink()
                path.symlink_to(source / target.relative_to(REPO_ROOT))
    return out


def median_startup(
    argv: Sequence[str], runs: int = 10, env: dict[str, str] | None = None
) -> tuple[float, int]:
    """Median wall time of `runs` runs of `argv` (one untimed warm-up run first) and the last exit code."""
    run_timed(argv, env=env)
    times, rc = [], 0
    for _ in range(runs):
        r = run_timed(argv, env=env)
        times.append(r.seconds)
        rc = r.rc
    return statistics.median(times), rc


class CommandFailed(RuntimeError):
    """A benchmarked command exited non-zero."""


def check(run: Run, what: str) -> Run:
    if run.rc != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-5:]
        raise CommandFailed(f"{what}: exit {run.rc}: " + " | ".join(tail))
    return run


# --------------------------------------------------------------------------------------------------------
# Results and tables


@dataclass
class Result:
    """Best (minimum) wall time over the repeats of one case, and the largest peak RSS seen."""

    name: str
    group: str
    nbytes: int
    best: float = float("inf")
    max_rss: int = 0
    note: str = ""
    runs: list[float] = field(default_factory=list)
    skipped: str = ""

    def add(self, seconds: float, rss: int = 0) -> None:
        self.runs.append(seconds)
        self.best = min(self.best, seconds)
        self.max_rss = max(self.max_rss, rss)

    @property
    def ok(self) -> bool:
        return not self.skipped and bool(self.runs)

    @property
    def gbps(self) -> float:
        return self.nbytes / 1e9 / self.best if self.ok else float("nan")


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> str:
    """A plain-text table (fixed-width columns, `right` column indices right-aligned)."""
    right = set(right)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            (str(c).rjust(w) if i in right else str(c).ljust(w))
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def ops_per_second(fn: Callable[[], object], seconds: float) -> float:
    runs = []
    for _ in range(3):
        count, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while True:
            fn()
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        runs.append(count / (now - start))
    return statistics.median(runs)


def cpu_pressure() -> str:
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return line.replace("some ", "")
    except (OSError, IndexError):
        return "n/a"


def console_script(name: str) -> str | None:
    """The installed console script `name` next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def pod_review(image: str, uid: str) -> bytes:
    """An AdmissionReview (admission.k8s.io/v1): a Pod CREATE in namespace `ml`, one container `image`."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "name": "bench",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bench", "namespace": "ml"},
                "spec": {"containers": [{"name": "model", "image": image}]},
            },
        },
    }
    return json.dumps(body).encode()


def signed_model_in_registry(root: Path, registry: Any) -> tuple[Any, dict[str, Any], Any]:
    """A one-shard model signed with a fresh P-256 key (`root/key.pem`, `root/key.pub.pem`), pushed to
    `registry` as `models/bench:v1`, its signature also in the directory store `root/store`.

    Returns the registry options, a ModelPolicy document trusting the key for `oci://REGISTRY/models/**`,
    and the push result (`manifest_digest`, `root_digest`).
    """
    from modelsec.distribution.push_pull import push_model
    from modelsec.policy import Policy
    from modelsec.registry.client import RegistryOptions
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.verifier.attestations import store_bundle
    from tests.conftest import write_tiny_model
    from tests.support.oci import PASSWORD, USER

    private, public = generate_private_key_pem("ecdsa-p256")
    (root / "key.pem").write_bytes(private)
    (root / "key.pub.pem").write_bytes(public)
    signer = load_private_key_file(root / "key.pem")
    model = write_tiny_model(root / "model", shards=1)
    sign_model(model, [signer])
    options = RegistryOptions(ca_file=registry.ca, username=USER, password=PASSWORD, timeout=5)
    pushed = push_model(
        model,
        f"oci://{registry.address}/models/bench:v1",
        Policy.from_key_files([root / "key.pub.pem"]),
        signer,
        options=options,
    )
    store_bundle(root / "store", (model / "model.sig").read_bytes())
    doc = {
        "apiVersion": "modelsec.dev/v1alpha1",
        "kind": "ModelPolicy",
        "policies": [
            {"name": "models", "match": [f"oci://{registry.address}/models/**"], "keys": ["key.pub.pem"]}
        ],
    }
    return options, doc, pushed
