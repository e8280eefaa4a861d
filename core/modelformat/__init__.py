"""The model-format kernel: what a model directory *is*, shared by signer, verifier, watermark and robustness.

- `modelsec.modelformat.safetensors_header`: the strict safetensors header parser (offsets, dtypes, shapes).
- `modelsec.modelformat.model_files`: the file walk beneath one directory descriptor, file-name rules, ignore
  rules and the OMS path order.
- `modelsec.modelformat.hashing`: the hashing engine (each file read once; SHA-256, SM3, BLAKE3 per tensor).
- `modelsec.modelformat.content`: pickles recognised by their bytes (pickle opcodes, torch zips, tar and
  zip archives, compressed wrappers), fed by the hashing engine, bounded by `Limits`.
- `modelsec.modelformat.side_json` and `modelsec.modelformat.shard_index`: the rules JSON side files and
  `model.safetensors.index.json` are held to, shared by the signer (refused before hashing) and the verifier.

Nothing here holds keys or makes a trust decision; the OMS predicate built from these digests lives in
`modelsec.attestations.predicates.oms`.

The public names live in the submodules (each with its own `__all__`); the package re-exports nothing, so
importing one submodule does not load the others.
"""

__all__: list[str] = []
