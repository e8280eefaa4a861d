"""SM2 signatures per second for each modelsec backend (OpenSSL via ctypes, hardened gmssl).

Usage: python bench/bench_sm2.py [--seconds 1.0] [--backends openssl,gmssl]

Each figure is the median of three timed runs of single-threaded calls through the public `Sm2Backend`
protocol (so it includes Z_A/e, DER checks and, for OpenSSL, EVP context set-up). "verify, new key" cycles
through more public keys than the OpenSSL backend caches, so every call decodes its key.
"""

from __future__ import annotations

import argparse
import sys

from modelsec.errors import BackendUnavailableError
from modelsec.signer.schemes.sm2 import api as sm2

try:  # bench/_common.py, when run as `python bench/bench_sm2.py`
    from _common import machine_lines, ops_per_second, render_table
except ImportError:  # pragma: no cover - run from elsewhere
    machine_lines = None  # type: ignore[assignment]
    render_table = None  # type: ignore[assignment]

MESSAGE = b"DSSEv1 28 application/vnd.in-toto+json 1274 " + b"x" * 1274  # a PAE of typical size


def measure(
    backend: sm2.Sm2Backend, key: sm2.Sm2PrivateKey, others: list[sm2.Sm2PrivateKey], seconds: float
) -> list[str]:
    signature = backend.sign(key, MESSAGE)
    cold = [(k.public_key, backend.sign(k, MESSAGE)) for k in others]
    position = 0

    def verify_cold() -> None:
        nonlocal position
        public, sig = cold[position % len(cold)]
        position += 1
        backend.verify(public, MESSAGE, sig)

    sign_rate = ops_per_second(lambda: backend.sign(key, MESSAGE), seconds)
    verify_rate = ops_per_second(lambda: backend.verify(key.public_key, MESSAGE, signature), seconds)
    cold_rate = ops_per_second(verify_cold, seconds)
    version = getattr(backend, "version", "")
    label = backend.name + (f" ({version})" if version else "")
    return [label, f"{sign_rate:,.0f}", f"{verify_rate:,.0f}", f"{cold_rate:,.0f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement (default 1.5)")
    parser.add_argument("--backends", default="openssl,gmssl")
    args = parser.parse_args()

    key = sm2.generate_private_key()
    others = [sm2.generate_private_key() for _ in range(40)]  # more than the OpenSSL backend caches
    rows = []
    for name in args.backends.split(","):
        try:
            backend = sm2.backend_by_name(name)
        except BackendUnavailableError as e:
            rows.append([name, "unavailable", str(e), ""])
            continue
        rows.append(measure(backend, key, others, args.seconds))

    header = ["backend", "sign/s", "verify/s", "verify, new key/s"]
    if machine_lines is not None:
        print("\n".join(machine_lines()))
    if render_table is not None:
        print(render_table(header, rows, right=(1, 2, 3)))
    else:
        for row in [header, *rows]:
            print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
