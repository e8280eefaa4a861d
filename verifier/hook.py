"""Route existing loaders through verification, so a serving script gains the check without code changes.

`install(policy)` replaces, process-wide:

* `safetensors.torch.load_file(path, device)` -> `modelsec.verifier.load_model(path, ...)` (the shard's
  model directory must hold bundles that the policy trusts);
* `safetensors.safe_open(path, framework="pt", ...)` (also as `safetensors.torch.safe_open`) ->
  `modelsec.verifier.open_model(path, ...)`; other frameworks are refused;
* Hugging Face `transformers`, if importable: `PreTrainedModel.from_pretrained(local_dir)` first runs a
  preflight (signatures, file set, pickle / remote-code refusal, digests of config and tokenizer files),
  and its safetensors reads go through the patched `safe_open`, so every tensor comes from verified
  private memory; its `disable_mmap` byte-loading path, which has no file name to verify, is refused.

Not covered: `safetensors.torch.load(bytes)` (bytes without a path cannot be matched to a signed model) and
hub downloads (reference a local directory). Opt in without code changes:

    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.hook serve.py --port 8080
    MODELSEC_POLICY=/etc/modelsec/policy.yaml python -m modelsec.verifier.hook -m my_server.main

No `.pth` file or import-time side effect is involved: nothing is patched unless `install()` is called.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from modelsec.errors import Error, PolicyViolationError, UnsupportedAlgorithmError
from modelsec.policy import Policy, PolicySet
from modelsec.signer.hashing import is_safetensors_name
from modelsec.verifier.loader import VerifiedSafeOpen, load_model, resolve_policy
from modelsec.verifier.verification import check_file_set, verify_files, verify_signatures

__all__ = ["install", "installed", "main", "preflight", "uninstall"]

_lock = threading.Lock()
_originals: dict[tuple[object, str], object] = {}
_policy: Policy | PolicySet | None = None


def _device_name(device: object) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _policy_for(path: Path) -> Policy:
    return resolve_policy(path, _policy)


def _verified_load_file(filename: str | os.PathLike[str], device: object = "cpu") -> dict[str, Any]:
    path = Path(filename)
    return load_model(path, _policy_for(path), device=_device_name(device))


def _verified_safe_open(
    filename: str | os.PathLike[str], framework: str, device: object = "cpu", **_ignored: object
) -> VerifiedSafeOpen:
    if framework not in ("pt", "torch", "pytorch"):
        raise UnsupportedAlgorithmError(
            f"{filename}: modelsec's verified safe_open serves framework='pt' only, not {framework!r}"
        )
    path = Path(filename)
    return VerifiedSafeOpen(path, _policy_for(path), device=_device_name(device))


def _refuse_unverifiable_bytes(*_args: object, **_kwargs: object) -> Any:
    raise PolicyViolationError(
        "loading safetensors from raw bytes (transformers disable_mmap) cannot be verified; "
        "load from a signed local directory instead"
    )


def preflight(model_dir: Path, policy: Policy | PolicySet | None = None) -> None:
    """Check a local model directory before a framework reads it: everything but the shards' bytes.

    Verifies the bundles, the file set, the pickle and remote-code refusals and the digests of every
    non-safetensors file (config, tokenizer, index); shards are verified when they are read through the
    patched `safe_open` / `load_file`.

    Raises:
        VerificationError: Any of the checks fails (see `modelsec.verifier.verify_model`).
        PolicyError: No usable policy.
    """
    resolved = resolve_policy(model_dir, policy if policy is not None else _policy)
    signed = verify_signatures(model_dir, resolved)
    names = check_file_set(signed, resolved)
    side = [n for n in names if not is_safetensors_name(n)]
    verify_files(signed, side, resolved, tensor_hash=None, whole_model=False)


def _wrap_from_pretrained(original: Any) -> Any:
    func = original.__func__

    def from_pretrained(cls: Any, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        path = Path(os.fspath(pretrained_model_name_or_path))
        if not path.is_dir():
            raise PolicyViolationError(
                f"{pretrained_model_name_or_path}: modelsec verifies local model directories only "
                "(download and sign it first)"
            )
        subfolder = kwargs.get("subfolder") or ""
        model_dir = path / subfolder if subfolder else path
        resolved = _policy_for(model_dir)
        if kwargs.get("trust_remote_code") and not resolved.allow_remote_code:
            raise PolicyViolationError(
                f"{path}: trust_remote_code=True is refused by policy {resolved.name!r} (allowRemoteCode)"
            )
        preflight(model_dir, resolved)
        return func(cls, pretrained_model_name_or_path, *args, **kwargs)

    return classmethod(from_pretrained)


def _patch(owner: object, name: str, replacement: object) -> None:
    key = (owner, name)
    if key not in _originals:
        # For a class, keep the raw descriptor (a classmethod), not the method bound to this class:
        # restoring a bound method would make every subclass call it with the base class.
        _originals[key] = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, replacement)


def install(policy: Policy | PolicySet | None = None) -> None:
    """Route safetensors and transformers loading through modelsec verification (process-wide).

    Args:
        policy: The policy to apply; None reads `$MODELSEC_POLICY` at each load.

    Raises:
        PolicyError: `policy` is None and `$MODELSEC_POLICY` is unset or invalid (checked now, fail fast).
    """
    global _policy
    with _lock:
        if policy is None:
            PolicySet.from_env()
        _policy = policy
        import safetensors
        import safetensors.torch

        # Import transformers before patching safetensors: its modules bind `safe_open` at import time,
        # and must record the library's original (restored by `uninstall`), not our replacement.
        mu: Any
        try:
            import transformers.modeling_utils as mu
        except ImportError:
            mu = None
        _patch(safetensors.torch, "load_file", _verified_load_file)
        _patch(safetensors, "safe_open", _verified_safe_open)
        _patch(safetensors.torch, "safe_open", _verified_safe_open)
        if mu is None:
            return
        if hasattr(mu, "safe_open"):
            _patch(mu, "safe_open", _verified_safe_open)
        if hasattr(mu, "safe_load_file"):
            _patch(mu, "safe_load_file", _verified_load_file)
        if hasattr(mu, "_safe_load_bytes"):
            _patch(mu, "_safe_load_bytes", _refuse_unverifiable_bytes)
        original = mu.PreTrainedModel.__dict__["from_pretrained"]
        if (mu.PreTrainedModel, "from_pretrained") not in _originals:
            _patch(mu.PreTrainedModel, "from_pretrained", _wrap_from_pretrained(original))


def installed() -> bool:
    """Whether `install()` is in effect."""
    return bool(_originals)


def uninstall() -> None:
    """Restore every patched function."""
    global _policy
    with _lock:
        for (owner, name), original in reversed(list(_originals.items())):
            setattr(owner, name, original)
        _originals.clear()
        _policy = None


def main(argv: Sequence[str] | None = None, *, run: Callable[..., Any] | None = None) -> int:
    """`python -m modelsec.verifier.hook [-m MODULE | SCRIPT] [ARGS...]` with `$MODELSEC_POLICY` set."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[-2] if __doc__ else "", file=sys.stderr)
        return 2
    try:
        install()
    except Error as e:
        print(f"modelsec: error: {e.diagnostics()}", file=sys.stderr)
        return 1
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
    from modelsec.verifier import hook as _hook

    sys.exit(_hook.main())
