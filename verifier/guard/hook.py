"""The runtime guard: every file and tensor a serving stack reads from a model directory is a verified byte.

`install(policy)` arranges, process-wide and lazily (a framework is patched when it is first imported, so a
plain interpreter start imports none of them):

* **Entry points are redirected to a verified snapshot** (`modelsec.verifier.guard.snapshot`): the first
  time a model directory reaches a guarded entry point it is verified whole, and the framework gets the
  snapshot's private read-only tree in place of the directory, so every non-tensor file it opens — configs,
  tokenizer files, chat templates, the index, generation configs, remote code — holds the verified bytes.
  Guarded: transformers' file resolution (`cached_file` / `cached_files`, the layer under configs,
  tokenizers and generation configs), `from_pretrained` of `AutoConfig`, the `AutoModel*` classes,
  `AutoTokenizer`, `AutoProcessor`, `AutoImageProcessor`, `AutoFeatureExtractor`, `PreTrainedConfig`,
  `PreTrainedModel`, tokenizers, processors, image processors, feature extractors and `GenerationConfig`,
  `pipeline()`, and sentence-transformers models (`SentenceTransformer`, `CrossEncoder`, `SparseEncoder`).
* **Names stay inside the tree**: a `subfolder=`, a file name given to `cached_file` / `cached_files`,
  `GenerationConfig`'s `config_file_name`, `gguf_file` that is absolute or has a `..` segment would be joined
  past the tree (`os.path.join`) onto unverified files: refused before anything is read. A path in the model
  directory that its bundles ignore (`--ignore-paths`, `.git/`) is refused by name, not reported as missing.
* **Tensors come from the verified loader**: `safetensors.safe_open` and `safetensors.torch.load_file` (and
  every copy of them that a loaded module holds) read a shard into private memory, compare its digests with
  the signed manifest and only then build tensors (`modelsec.verifier.loader`). A shard path inside a
  snapshot is served from the signed model behind it; any other shard path first has its model verified
  whole. transformers' byte-loading path (`disable_mmap`), which has no file name to verify, is refused.
* **Remote code**: `trust_remote_code=True` is refused unless the policy allows remote code; even then only a
  local `module.Class` reference whose module is a signed file runs, imported from a private per-process
  module directory filled from the snapshot (never from the shared `HF_MODULES_CACHE`); cross-repo
  references (`org/repo--module.Class`) are refused. Nothing is ever fetched: a reference that is not a
  local path is refused.
* **Pinning**: `expected_digests` (or `$MODELSEC_MODEL_DIGEST`: a bare `sha256:<hex>` or the whole
  `modelsec.dev/models` annotation value `uri@sha256:<hex>[,...]`) must contain the model's root digest.

Layout: this module installs and uninstalls the guard and holds the table of framework patchers
(`_PATCHERS`); `modelsec.verifier.guard.patching` is the core every framework module shares (`guarded_path`,
the record of patches and their restoration, the `from_pretrained` wrapper); each framework has one module
under `modelsec.verifier.guard.frameworks` whose `PATCHERS` maps the framework module that defines an entry
point to the function that patches it, applied by the post-import hooks (`modelsec.verifier.guard.postimport`)
when that module is first imported. Adding a framework touches its module
(`verifier/guard/frameworks/<name>.py`, built on `patching`) and one registration line: its `PATCHERS` in
`_PATCHERS` below (with its name in the import above it).

Every process: with the package's start-up hook, any Python process started with `$MODELSEC_POLICY` set
installs the guard (see `modelsec.verifier.guard.boot`); without it, wrap a command:

    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.guard.hook serve.py --port 8080
    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.guard.hook -m my_server.main

Not covered: `safetensors.torch.load(bytes)` (bytes without a path cannot be matched to a signed model) and
files a framework reads from outside the model directory (its own configuration and caches).
"""

from __future__ import annotations

import importlib
import runpy
import sys
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from modelsec.errors import Error
from modelsec.policy import Policy, PolicySet
from modelsec.verifier.admission import admit_model, report_warnings
from modelsec.verifier.audit import enable_stderr_audit
from modelsec.verifier.guard import patching
from modelsec.verifier.guard.frameworks import safetensors, sentence_transformers, transformers
from modelsec.verifier.guard.patching import Patcher, guarded_path
from modelsec.verifier.guard.postimport import when_imported
from modelsec.verifier.pinning import DigestPin, digest_pins_from_env, expected_digest_set
from modelsec.verifier.verification import check_file_set, verify_files, verify_signatures

__all__ = ["guarded_path", "install", "installed", "main", "preflight", "uninstall"]

# The frameworks the guard patches, one line each: framework module name -> patcher, registered in this order.
_PATCHERS: tuple[Mapping[str, Patcher], ...] = (
    safetensors.PATCHERS,
    transformers.PATCHERS,
    sentence_transformers.PATCHERS,
)

_lock = threading.RLock()
_active = False
_generation = 0


def preflight(model_dir: Path, policy: Policy | PolicySet | None = None) -> None:
    """Check a local model directory before a framework reads it: everything but the shards' bytes.

    Verifies the bundles, the file set, the pickle and remote-code refusals and the digests of every
    non-safetensors file (config, tokenizer, index); shards are verified when they are read through the
    patched `safe_open` / `load_file`. The guard itself verifies whole directories (`open_snapshot`).

    Raises:
        VerificationError: Any of the checks fails (see `modelsec.verifier.verify_model`).
        PolicyError: No usable policy.
    """
    from modelsec.modelformat.hashing import is_safetensors_name

    admission = admit_model(model_dir, policy if policy is not None else patching.current_policy())
    resolved = admission.policy
    signed = verify_signatures(model_dir, admission)
    report_warnings(signed.warnings)
    names = check_file_set(signed, resolved)
    side = [n for n in names if not is_safetensors_name(n)]
    verify_files(signed, side, resolved, tensor_hash=None, whole_model=False)


def _when_active(generation: int, patcher: Patcher) -> Patcher:
    def callback(module: ModuleType) -> None:
        with _lock:
            if _active and generation == _generation:
                patcher(module)

    return callback


def install(
    policy: Policy | PolicySet | None = None, *, expected_digests: Collection[str] | None = None
) -> None:
    """Install the runtime guard in this process (see the module docstring); idempotent.

    Frameworks already imported are patched now, the others when they are first imported.

    Args:
        policy: The policy to apply; None loads `$MODELSEC_POLICY` now (and keeps it).
        expected_digests: Model root digests (`sha256:<hex>`) every guarded model must have; None reads
            `$MODELSEC_MODEL_DIGEST` (unset: no pin).

    Raises:
        PolicyError: `policy` is None and `$MODELSEC_POLICY` is unset or invalid, or
            `$MODELSEC_MODEL_DIGEST` is malformed (checked now: fail fast).
    """
    global _active, _generation
    with _lock:
        resolved: Policy | PolicySet = policy if policy is not None else PolicySet.from_env()
        pins = (
            tuple(DigestPin(None, d) for d in expected_digest_set(expected_digests))
            if expected_digests is not None
            else digest_pins_from_env()
        )
        patching.configure(resolved, pins)
        if _active:
            return
        _active = True
        _generation += 1
        # Frameworks already imported are patched now, within this call: one sweep of sys.modules for all of
        # them (each sweep walks every attribute of every loaded module); later imports sweep on their own.
        with patching.one_sweep():
            for patchers in _PATCHERS:
                for name, patcher in patchers.items():
                    when_imported(name, _when_active(_generation, patcher))


def installed() -> bool:
    """Whether `install()` is in effect."""
    return _active


def uninstall() -> None:
    """Restore every patched function; frameworks imported later are no longer patched."""
    global _active, _generation
    with _lock:
        patching.restore_all()
        patching.configure(None, None)
        _active = False
        _generation += 1


def main(argv: Sequence[str] | None = None, *, run: Callable[..., Any] | None = None) -> int:
    """`python -m modelsec.verifier.guard.hook [-m MODULE | SCRIPT] [ARGS...]` with `$MODELSEC_POLICY` set."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[-3] if __doc__ else "", file=sys.stderr)
        return 2
    try:
        install()
    except Error as e:
        print(f"modelsec: error: {e.diagnostics()}", file=sys.stderr)
        return 1
    enable_stderr_audit()  # this command is the application: its audit lines go to the container log
    if args[0] == "-m":
        if len(args) < 2:
            print("modelsec: error: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = args[1:]
        (run or runpy.run_module)(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        (run or runpy.run_path)(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # Run the importable module's main, not this `__main__` copy, so that the script sees one hook state.
    _hook = importlib.import_module("modelsec.verifier.guard.hook")
    sys.exit(_hook.main())
