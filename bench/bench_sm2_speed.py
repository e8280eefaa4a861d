#!/usr/bin/env python3
"""SM2 signatures and verifications per second: modelsec's signer against `openssl speed sm2`, in one run.

Usage: python bench/bench_sm2_speed.py [--seconds 3] [--rounds 3]

modelsec is measured through the path `modelsec sign` and `verify` take: a key loaded by
`load_private_key` (its `sign`, then the default SM2 backend) and a `TrustedKey` (`verify`), single-threaded,
over the same 20-byte message `openssl speed` signs. Rounds alternate `openssl speed -seconds S sm2` and
modelsec, so that other load on the machine hits both; each figure is the best of the rounds (the round
least disturbed by other jobs, as `timeit` takes the minimum), and the median is printed beside the ratio;
"paired" is the median over rounds of each round's own ratio (modelsec's rate over the `openssl speed` run
just before it), which cancels load that drifts between rounds on a shared machine.

`openssl speed` counts operations per second of *user CPU time* (its default; `-elapsed` would use wall
time), so the ratio uses modelsec's operations per user CPU second as well; the wall-clock rate is printed
beside it. Targets: sign >= 0.9 of `openssl speed` (issue 20), verify >= 0.95 (issue 32).
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from modelsec.signer.keys import load_private_key, load_trusted_key
from modelsec.signer.schemes.sm2.api import default_backend, generate_private_key

MESSAGE = bytes(20)  # `openssl speed` signs a 20-byte buffer (apps/speed.c)
_SPEED_LINE = re.compile(r"^\s*256 bits SM2 \(CurveSM2\)\s+\S+s\s+\S+s\s+([\d.]+)\s+([\d.]+)\s*$", re.M)


def _user_cpu() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def rates(fn: Callable[[], object], seconds: float) -> tuple[float, float]:
    """Run `fn` for `seconds` of wall time; return (operations per user CPU second, per wall second)."""
    fn()
    count, cpu0, start = 0, _user_cpu(), time.perf_counter()
    deadline = start + seconds
    while True:
        fn()
        count += 1
        if count % 16 == 0 and time.perf_counter() >= deadline:
            break
    wall, cpu = time.perf_counter() - start, _user_cpu() - cpu0
    return count / max(cpu, 1e-9), count / wall


def _paired(ours: list[float], reference: list[float]) -> float:
    """The median over rounds of each round's ratio ours / reference."""
    return statistics.median(m / o for m, o in zip(ours, reference, strict=True))


def openssl_speed(seconds: int) -> tuple[float, float]:
    """Run `openssl speed -seconds S sm2`; return its (sign/s, verify/s)."""
    out = subprocess.run(
        ["openssl", "speed", "-seconds", str(seconds), "sm2"], capture_output=True, text=True, check=True
    ).stdout
    match = _SPEED_LINE.search(out)
    if match is None:
        raise SystemExit(f"cannot parse `openssl speed sm2` output:\n{out}")
    return float(match.group(1)), float(match.group(2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3, help="seconds per measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args()
    if shutil.which("openssl") is None:
        raise SystemExit("the openssl CLI is not installed")

    key = generate_private_key()
    signer = load_private_key(key.to_pem(), name="bench-sm2")
    trusted = load_trusted_key(key.public_key.to_pem(), name="bench-sm2.pub")
    signature = signer.sign(MESSAGE)
    trusted.verify(signature, MESSAGE)

    samples: dict[str, list[float]] = {k: [] for k in ("o_sign", "o_verify", "m_sign", "m_sign_wall")}
    samples.update({"m_verify": [], "m_verify_wall": []})
    for _ in range(args.rounds):
        o_sign, o_verify = openssl_speed(args.seconds)
        samples["o_sign"].append(o_sign)
        samples["o_verify"].append(o_verify)
        cpu_rate, wall_rate = rates(lambda: signer.sign(MESSAGE), args.seconds)
        samples["m_sign"].append(cpu_rate)
        samples["m_sign_wall"].append(wall_rate)
        cpu_rate, wall_rate = rates(lambda: trusted.verify(signature, MESSAGE), args.seconds)
        samples["m_verify"].append(cpu_rate)
        samples["m_verify_wall"].append(wall_rate)
    med = {k: statistics.median(v) for k, v in samples.items()}
    best = {k: max(v) for k, v in samples.items()}

    backend = default_backend()
    print("\n".join(c.machine_lines()))
    version = getattr(backend, "version", "")
    print(f"SM2 backend: {backend.name} ({version}); {args.rounds} rounds of {args.seconds} s each")
    rows = [
        [
            op,
            f"{best['o_' + op]:,.0f}",
            f"{best['m_' + op]:,.0f}",
            f"{best['m_' + op + '_wall']:,.0f}",
            f"{best['m_' + op] / best['o_' + op]:.2f}",
            f"{med['m_' + op] / med['o_' + op]:.2f}",
            f"{_paired(samples['m_' + op], samples['o_' + op]):.2f}",
            target,
        ]
        for op, target in (("sign", ">= 0.90"), ("verify", ">= 0.95"))
    ]
    header = [
        "SM2",
        "openssl speed /s",
        "modelsec /cpu-s",
        "modelsec /wall-s",
        "ratio (best)",
        "ratio (median)",
        "paired",
        "target",
    ]
    print(c.render_table(header, rows, right=(1, 2, 3, 4, 5, 6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
