"""Hard limits applied before any parsing or hashing (one object, passed everywhere)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits applied before any parsing or hashing.

    Every reader in modelsec checks the relevant limit *before* it allocates or parses, so an
    attacker-declared size never drives an allocation.

    Attributes:
        max_files: Most regular files a model directory may hold (walk stops and fails beyond it).
        max_depth: Deepest directory nesting below the model root.
        max_safetensors_header_bytes: Largest safetensors JSON header (safetensors' own MAX_HEADER_SIZE,
            100,000,000 bytes).
        max_tensors_per_file: Most tensors one safetensors header may declare.
        max_bundle_bytes: Largest signature bundle file (16 MiB).
        max_json_side_file_bytes: Largest `config.json` / index JSON read into memory for policy checks.
        max_path_bytes: Longest relative resource name, in UTF-8 bytes.
        hash_chunk_bytes: Read size of the hashing engine (memory per worker thread).
    """

    max_files: int = 65_536
    max_depth: int = 32
    max_safetensors_header_bytes: int = 100_000_000  # safetensors' own MAX_HEADER_SIZE
    max_tensors_per_file: int = 1_000_000
    max_bundle_bytes: int = 16 * 2**20
    max_json_side_file_bytes: int = 64 * 2**20
    max_path_bytes: int = 4096
    # 1 MiB: every hasher re-reads each chunk, so it should stay near the L2 cache (measured: SHA-256 +8%
    # and SHA-256+BLAKE3 +9% CPU at 8 MiB compared with 1 MiB on this machine; bench/bench_sign_verify.py).
    hash_chunk_bytes: int = 2**20
