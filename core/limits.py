"""Hard limits applied before any parsing or hashing (one object, passed everywhere)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SAFETENSORS_MAX_HEADER_SIZE", "Limits"]

# safetensors' own MAX_HEADER_SIZE: the largest header any safetensors reader accepts, and so the largest
# `max_safetensors_header_bytes` a policy may configure.
SAFETENSORS_MAX_HEADER_SIZE = 100_000_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits applied before any parsing or hashing.

    Every reader in modelsec checks the relevant limit *before* it allocates or parses, so an
    attacker-declared size never drives an allocation.

    Attributes:
        max_files: Most regular files a model directory may hold (walk stops and fails beyond it).
        max_depth: Deepest directory nesting below the model root.
        max_safetensors_header_bytes: Largest safetensors JSON header, checked from the 8-byte prefix before
            the header is read. Default 16 MiB, chosen from real checkpoints: all-MiniLM-L6-v2 has an 11,408
            byte header (104 tensors, ~110 bytes each); a dense LLM with ~10^4 tensors at ~150 bytes each
            needs ~1.5 MB in one file, and even ~10^5 tensors (a large unsharded MoE) fit. Parsing costs
            memory in proportion to the header (measured up to ~33 bytes of peak RSS per header byte, for
            headers of tiny `__metadata__` entries; tests/attacks/test_header_budget.py), so the default
            bounds a parse before any signature check near 550 MiB (the old 100,000,000 default: 3 GiB).
            A policy may raise it up to safetensors' own MAX_HEADER_SIZE, `SAFETENSORS_MAX_HEADER_SIZE`
            (100,000,000 bytes), the documented maximum override.
        max_tensors_per_file: Most tensors one safetensors header may declare.
        max_bundle_bytes: Largest signature bundle file (16 MiB).
        max_json_side_file_bytes: Largest `config.json` / index JSON read into memory for policy checks.
        max_path_bytes: Longest relative resource name, in UTF-8 bytes.
        hash_chunk_bytes: Read size of the hashing engine (memory per worker thread).
        max_content_inspect_bytes: Bytes of a file inspected for pickles by content
            (`modelsec.modelformat.content`): its first bytes (for a zip also its last bytes, where the
            directory is), and the most output decompressed from one compressed stream (four times this
            for all streams of one file together). 1 MiB: a torch zip's `data.pkl` name and every
            compressor's first block fit; an archive that does not fit is refused under `refusePickle`.
        max_content_nesting: Most archives and compressed streams nested in one another that are
            inspected (`checkpoint.tar.gz` holding a torch zip is 3); deeper nesting is refused under
            `refusePickle`.
    """

    max_files: int = 65_536
    max_depth: int = 32
    max_safetensors_header_bytes: int = 16 * 2**20
    max_tensors_per_file: int = 1_000_000
    max_bundle_bytes: int = 16 * 2**20
    max_json_side_file_bytes: int = 64 * 2**20
    max_path_bytes: int = 4096
    # 1 MiB: every hasher re-reads each chunk, so it should stay near the L2 cache (measured: SHA-256 +8%
    # and SHA-256+BLAKE3 +9% CPU at 8 MiB compared with 1 MiB on this machine; bench/bench_sign_verify.py).
    hash_chunk_bytes: int = 2**20
    max_content_inspect_bytes: int = 2**20
    max_content_nesting: int = 4
