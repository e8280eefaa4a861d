"""Load a classifier for the gate: verified safetensors weights plus an operator-supplied architecture.

Order (an invariant; each step runs only if every earlier one passed):

1-3. `modelsec.verifier.load_signed_model` verifies the whole model directory under the policy
   (signatures, file set, refusals) and reads each shard once into private memory, hashing it as it is
   read; tensors are built from exactly those verified bytes (DESIGN.md decision 5), and the model root
   digest they were verified under is the attestation subject.
4. The architecture is resolved from an import path `package.module:factory` (never from the model
   directory), called without arguments, and the tensors are loaded with `load_state_dict(strict=True)`.
5. The module is put into eval mode with every parameter frozen, and moved to the requested device.

Pickle checkpoints are never read: the verifier refuses them and only safetensors bytes reach torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from modelsec.errors import MalformedArtifactError, PolicyError
from modelsec.policy import Policy
from modelsec.robustness.imports import resolve_import_path
from modelsec.verifier.admission import ModelAdmission

__all__ = ["VerifiedClassifier", "build_classifier", "load_verified_model"]


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
    policy: Policy | ModelAdmission,
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
    from modelsec.verifier import load_signed_model

    loaded = load_signed_model(model_dir, policy, bundles=bundles)
    if not loaded.shards:
        raise MalformedArtifactError(f"{model_dir}: the signed manifest lists no *.safetensors file")
    module = build_classifier(architecture, loaded.tensors, device=device, forbid_under=model_dir)
    return VerifiedClassifier(
        module=module,
        root_digest=loaded.root_digest,
        model_name=Path(os.path.abspath(model_dir)).name,
        weights=loaded.shards,
        architecture=architecture,
    )
