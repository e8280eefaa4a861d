"""Push and pull of a sharded model against the raw blob transfer of the same bytes (issue 32.3).

Usage: python bench/bench_registry_transfer.py [--gib 1] [--shards 4] [--rounds 3] [--transfers 4]
       [--chunk-mib 64]

Set-up (a temporary directory): a real CNCF distribution registry (Debian `docker-registry` 2.8, TLS and
htpasswd on loopback, started as the tests start it: `tests/support/oci.py`), and a model of `--gib` GiB in
`--shards` safetensors shards of random bytes (plus `config.json`), signed with ECDSA P-256.

Each round runs four transfers, alternating the order of the two in each pair from round to round, each
into a repository of its own (no blob is there yet: every byte is sent):

* `raw push`: for each file, `POST /v2/<repo>/blobs/uploads/` then one monolithic `PUT ...?digest=` with the
  file object as the body, one after the other, through one `requests.Session` with the same TLS and
  credentials (the digests are computed before the clock starts);
* `modelsec push`: `push_model` (the directory verified against its signature, then the layers uploaded
  `--transfers` at a time, chunked, each file hashed as it is sent, then the manifest, tags and referrers);
* `raw pull`: for each layer, `GET /v2/<repo>/blobs/<digest>` streamed into a file, one after the other
  (nothing hashed);
* `modelsec pull`: `pull_model` (manifest, evidence, layers `--transfers` at a time hashed as written
  into a staging directory, the staged model verified against its signature, then one rename).

The figure is the ratio of the median wall times (target <= 1.3 each way). The verification that push and
pull make (`verify_model` of the same directory, timed alone in each round) is printed beside it: it is
work the raw transfer does not do. (Pull's own verification reads no layer again: it compares the digests
taken as each layer was written, so subtracting the whole `verify_model` understates pull's cost.) The
client's CPU seconds are printed too. Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the registry the tests start
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine_lines, render_table  # noqa: E402

TARGET = 1.3


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of another process, from `/proc/PID/stat`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(fn: Callable[[], object], registry_pid: int) -> tuple[float, float, float]:
    """Wall seconds, this process's CPU seconds and the registry's CPU seconds of `fn()`."""
    wall, cpu, served = time.perf_counter(), _cpu(), _process_cpu(registry_pid)
    fn()
    return time.perf_counter() - wall, _cpu() - cpu, _process_cpu(registry_pid) - served


def _write_model(root: Path, gib: float, shards: int) -> list[Path]:
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    per_shard = int(gib * 2**30) // shards
    rng = np.random.default_rng(32)
    for i in range(shards):
        tensor = np.frombuffer(rng.bytes(per_shard), dtype=np.uint8)
        save_file({f"shard{i}": tensor}, str(root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"))
    (root / "config.json").write_text('{"model_type": "bench"}')
    return sorted(p for p in root.iterdir() if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transfers", type=int, default=4)
    parser.add_argument(
        "--chunk-mib", type=int, default=64, help="upload PATCH size (RegistryOptions.chunk_bytes)"
    )
    args = parser.parse_args()

    import requests

    from modelsec.distribution.push_pull import pull_model, push_model
    from modelsec.policy import Policy
    from modelsec.registry.client import RegistryOptions
    from modelsec.signer import load_private_key_file, sign_model
    from modelsec.signer.keys import generate_private_key_pem
    from modelsec.verifier import verify_model
    from tests.support.oci import PASSWORD, USER, registry_missing_reason, run_registry

    missing = registry_missing_reason()
    if missing:
        print(missing)
        return 2
    for line in machine_lines():
        print(line)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    with (
        tempfile.TemporaryDirectory(
            prefix="bench-registry-", dir=ROOT / ".bench" if (ROOT / ".bench").is_dir() else None
        ) as tmp,
        run_registry(Path(tmp) / "r") as reg,
    ):
        work = Path(tmp)
        private, public = generate_private_key_pem("ecdsa-p256")
        (work / "key.pem").write_bytes(private)
        (work / "key.pub.pem").write_bytes(public)
        signer = load_private_key_file(work / "key.pem")
        policy = Policy.from_key_files([work / "key.pub.pem"])
        model = work / "model"
        files = _write_model(model, args.gib, args.shards)
        sign_model(model, [signer])
        blobs = [(p, "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size) for p in files]
        total = sum(size for _, _, size in blobs)
        print(f"model: {len(files)} files, {total / 2**30:.3f} GiB; registry {reg.address}")
        print(f"transfers {args.transfers}, chunks {args.chunk_mib} MiB")
        settings = {"transfers": args.transfers, "chunk_bytes": args.chunk_mib * 2**20}
        # A client without these settings (an older commit, for a "before" figure) runs without them.
        known = {f.name for f in dataclasses.fields(RegistryOptions)}
        options = RegistryOptions(
            ca_file=reg.ca,
            username=USER,
            password=PASSWORD,
            timeout=60,
            **{k: v for k, v in settings.items() if k in known},
        )
        print(
            f"client settings: {', '.join(f'{k}={v}' for k, v in settings.items() if k in known) or 'none'}"
        )
        session = requests.Session()
        session.trust_env = False
        session.auth = (USER, PASSWORD)
        session.verify = str(reg.ca)
        base = f"https://{reg.address}/v2/"

        def raw_push(repo: str) -> None:
            for path, digest, size in blobs:
                start = session.post(f"{base}{repo}/blobs/uploads/", timeout=60)
                assert start.status_code == 202, start.status_code
                location = start.headers["Location"]
                location = f"https://{reg.address}{location}" if location.startswith("/") else location
                sep = "&" if "?" in location else "?"
                with open(path, "rb") as f:
                    done = session.put(
                        f"{location}{sep}digest={digest}",
                        data=f,
                        headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                        timeout=60,
                    )
                assert done.status_code == 201, done.status_code

        def raw_pull(repo: str, dest: Path) -> None:
            dest.mkdir()
            for path, digest, _ in blobs:
                with session.get(f"{base}{repo}/blobs/{digest}", stream=True, timeout=60) as response:
                    assert response.status_code == 200, response.status_code
                    with open(dest / path.name, "wb") as sink:
                        for chunk in response.iter_content(2**20):
                            sink.write(chunk)

        times: dict[str, list[tuple[float, float, float]]] = {
            k: [] for k in ("raw push", "modelsec push", "raw pull", "modelsec pull", "verify alone")
        }
        pulls = work / "pulls"
        pulls.mkdir()
        for r in range(args.rounds):
            pair = [
                ("raw push", lambda r=r: raw_push(f"bench/raw{r}")),
                (
                    "modelsec push",
                    lambda r=r: push_model(
                        model, f"oci://{reg.address}/bench/ms{r}:v1", policy, signer, options=options
                    ),
                ),
            ]
            for name, fn in pair if r % 2 == 0 else reversed(pair):
                times[name].append(_timed(fn, reg.process.pid))
            pair = [
                ("raw pull", lambda r=r: raw_pull(f"bench/raw{r}", pulls / f"raw{r}")),
                (
                    "modelsec pull",
                    lambda r=r: pull_model(
                        f"oci://{reg.address}/bench/ms{r}:v1", pulls / f"ms{r}", policy, options=options
                    ),
                ),
            ]
            for name, fn in pair if r % 2 == 0 else reversed(pair):
                times[name].append(_timed(fn, reg.process.pid))
            times["verify alone"].append(_timed(lambda: verify_model(model, policy), reg.process.pid))
            shutil.rmtree(pulls)
            pulls.mkdir()
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f}s" for k, v in times.items()), flush=True
            )

    def med(name: str, i: int) -> float:
        return statistics.median(t[i] for t in times[name])

    rows = []
    for name in times:
        rows.append(
            [
                name,
                f"{med(name, 0):.2f}",
                f"{total / 2**20 / med(name, 0):.0f}",
                f"{med(name, 1):.2f}",
                f"{med(name, 2):.2f}",
            ]
        )
    header = ["transfer", "wall s (median)", "MiB/s", "client CPU s", "registry CPU s"]
    print(render_table(header, rows, right=(1, 2, 3, 4)))
    ok = True
    for way in ("push", "pull"):
        ratio = med(f"modelsec {way}", 0) / med(f"raw {way}", 0)
        verdict = "PASS" if ratio <= TARGET else "FAIL"
        ok &= ratio <= TARGET
        less = (med(f"modelsec {way}", 0) - med("verify alone", 0)) / med(f"raw {way}", 0)
        both = [med(f"{who} {way}", 1) + med(f"{who} {way}", 2) for who in ("modelsec", "raw")]
        print(
            f"{way}: modelsec / raw = {ratio:.2f}x wall (target <= {TARGET}x) {verdict}; without the "
            f"verification it makes: {less:.2f}x; CPU (client + registry) {both[0] / both[1]:.2f}x, without "
            f"the verification {(both[0] - med('verify alone', 1)) / both[1]:.2f}x"
        )
    print(f"uptime: {os.popen('uptime').read().strip()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
