"""Load a classifier for the gate: verified safetensors weights plus an operator-supplied architecture.

Order (an invariant; each step runs only if every earlier one passed):

1. `modelsec.verifier.verify_model` checks the whole model directory against its signed bundles under the
   policy (signatures, file set, every digest); it returns the verified manifest and the model root digest.
2. Each signed `*.safetensors` file is read once into private memory (opened below the model root without
   following links), hashed, and compared in constant time with the verified manifest's digest for it.
   The file could have changed since step 1; what counts is that *these bytes* match the signed digest
   (DESIGN.md decision 5: hash exactly the bytes you load).
3. The header of that buffer is parsed strictly (`modelsec.signer.safetensors_header`) and the tensors are
   built from the same buffer with `safetensors.torch.load` (no mmap of the file).
4. The architecture is resolved from an import path `package.module:factory` (never from the model
   directory), called without arguments, and the tensors are loaded with `load_state_dict(strict=True)`.
5. The module is put into eval mode with every parameter frozen, and moved to the requested device.

Pickle checkpoints are never read: the verifier refuses them and only safetensors bytes reach torch.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from modelsec.errors import DigestMismatchError, MalformedArtifactError, PolicyError
from modelsec.limits import Limits
from modelsec.policy import Policy
from modelsec.robustness._imports import resolve_import_path
from modelsec.signer.hashing import new_hasher
from modelsec.signer.manifest import Manifest
from modelsec.signer.model_files import open_beneath, open_model_root
from modelsec.signer.safetensors_header import parse_header, parse_header_length

__all__ = ["VerifiedClassifier", "build_classifier", "load_verified_model", "read_verified_weights"]


@dataclass(frozen=True, slots=True)
class VerifiedClassifier:
    """A classifier whose weights matched the signed manifest.

    Attributes:
        module: The network, in eval mode, parameters frozen (`requires_grad=False`), on its device.
        root_digest: The model root digest (hex SHA-256 OMS subject digest): the attestation subject.
        model_name: The model directory's name (informational subject name).
        weights: The safetensors files loaded, in manifest order.
        architecture: The import path of the factory.
    """

    module: nn.Module
    root_digest: str
    model_name: str
    weights: tuple[str, ...]
    architecture: str


def read_verified_weights(
    model_dir: Path, manifest: Manifest
) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """Read every signed safetensors file once, check it against `manifest`, and build its tensors.

    Args:
        model_dir: The model directory.
        manifest: A manifest whose signature was verified (`VerifiedModel.bundles[i].manifest`).

    Returns:
        All tensors by name (CPU, built from the hashed buffers), and the file names read.

    Raises:
        MalformedArtifactError: No safetensors file is signed, a header is malformed, or two shards hold
            the same tensor name.
        DigestMismatchError: A file's bytes differ from the signed digest.
        PolicyViolationError: A path component is a symlink.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    names = [r.name for r in manifest.resources if r.name.endswith(".safetensors")]
    if not names:
        raise MalformedArtifactError(f"{model_dir}: the signed manifest lists no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    limits = Limits()
    root_fd = open_model_root(model_dir)
    try:
        for name in names:
            what = f"{model_dir}/{name}"
            fd = open_beneath(root_fd, name, what=str(model_dir))
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            hasher = new_hasher(manifest.hash_type)
            hasher.update(data)
            resource = manifest.resource(name)
            if resource is None:  # names come from the manifest; kept as a fail-closed guard
                raise MalformedArtifactError(f"{what}: not in the signed manifest")
            actual = hasher.digest()
            if not hmac.compare_digest(actual, resource.digest):
                raise DigestMismatchError(
                    what, resource.digest.hex(), actual.hex(), algorithm=manifest.hash_type.value
                )
            n = parse_header_length(data[:8], len(data), path=what, limits=limits)
            parse_header(data[8 : 8 + n], len(data), path=what, limits=limits)
            try:
                tensors = load(data)
            except (SafetensorError, ValueError, RuntimeError) as e:
                raise MalformedArtifactError(f"{what}: cannot build tensors: {e}") from e
            duplicate = sorted(set(tensors) & set(state))
            if duplicate:
                raise MalformedArtifactError(f"{what}: tensor `{duplicate[0]}` is also held by another shard")
            state.update(tensors)
    finally:
        os.close(root_fd)
    return state, tuple(names)


def build_classifier(
    architecture: str,
    state: dict[str, torch.Tensor],
    *,
    device: str | torch.device = "cpu",
    forbid_under: Path | None = None,
) -> nn.Module:
    """Instantiate `architecture` and load `state` into it strictly; eval mode, frozen, on `device`.

    Args:
        architecture: Import path `package.module:factory`; the factory takes no arguments and returns an
            `nn.Module` whose `state_dict` keys equal the tensor names.
        state: Tensors by name (already verified).
        device: Target device.
        forbid_under: Refuse a factory module located below this directory (the model directory).

    Returns:
        The module, `eval()`, every parameter with `requires_grad=False`.

    Raises:
        PolicyError: The factory cannot be imported, fails, does not return a module, or its parameter
            names or shapes do not match the weights.
        PolicyViolationError: The factory's module lies inside the model directory.
    """
    factory = resolve_import_path(architecture, what="architecture", forbid_under=forbid_under)
    try:
        module = factory()
    except Exception as e:
        raise PolicyError(f"architecture {architecture}: factory failed: {type(e).__name__}: {e}") from e
    if not isinstance(module, nn.Module):
        raise PolicyError(f"architecture {architecture}: the factory returned a {type(module).__name__}")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise PolicyError(f"architecture {architecture} does not match the verified weights: {e}") from e
    module.eval()
    module.requires_grad_(False)
    return module.to(device)


def load_verified_model(
    model_dir: Path,
    policy: Policy,
    architecture: str,
    *,
    bundles: Sequence[Path] | None = None,
    device: str | torch.device = "cpu",
) -> VerifiedClassifier:
    """Verify `model_dir` under `policy`, then build the classifier from exactly the verified bytes.

    See the module docstring for the order of checks.

    Args:
        model_dir: The signed model directory (safetensors shards and side files).
        policy: Trusted keys and requirements for the weights signatures.
        architecture: Import path `package.module:factory` of the network.
        bundles: Explicit bundle paths (default: the bundles found in `model_dir`).
        device: Where to put the module.

    Returns:
        The classifier with the model root digest.

    Raises:
        SignatureError: No trusted key signed the model, or a required algorithm is missing.
        DigestMismatchError: A file differs from the signed manifest (at verification or at load).
        FileSetMismatchError: Files were added or removed.
        MalformedArtifactError: A bundle, manifest or safetensors header is malformed.
        PolicyViolationError: Symlinks, pickle files, remote code, or a factory inside the model directory.
        PolicyError: The architecture cannot be imported or does not match the weights.

    Example:
        >>> policy = Policy.from_key_files([Path("trust/ci.pub.pem")])  # doctest: +SKIP
        >>> load_verified_model(Path("lenet"), policy, "lenet5:lenet5").root_digest  # doctest: +SKIP
    """
    from modelsec.verifier import verify_model

    verified = verify_model(model_dir, policy, bundles=bundles)
    state, names = read_verified_weights(model_dir, verified.manifest)
    module = build_classifier(architecture, state, device=device, forbid_under=model_dir)
    return VerifiedClassifier(
        module=module,
        root_digest=verified.root_digest,
        model_name=Path(os.path.abspath(model_dir)).name,
        weights=names,
        architecture=architecture,
    )
