"""`verify` options that trust identities without a policy file, in model_signing's and cosign's words.

* `--certificate-chain ROOT.pem [--identity SAN]`: model_signing's `certificate` method. The PEM files hold
  the trusted roots (every certificate in them is a trust anchor, as model_signing's own verifier treats
  its `--certificate_chain`); the bundle's own certificates are only untrusted path material. Without
  `--identity` any code-signing leaf under the roots is accepted, as model_signing does.
* `--identity ID --identity-provider ISSUER [--trusted-root production|staging|FILE]`: keyless Sigstore
  (`model_signing verify sigstore`, cosign's `--certificate-identity` / `--certificate-oidc-issuer`),
  verified offline against the named trusted root (default: the embedded production root).

Either builds a one-authority policy (beside any `--trusted-key`), every role allowed, like `--trusted-key`.
Combinations that mean nothing are usage errors (exit 2), never silently dropped.
Only click is imported at module level (see `modelsec.cli.common`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = ["IdentityOptions", "identity_options"]

F = TypeVar("F", bound=Callable[..., Any])
_ROOT_NAMES = ("production", "staging")


@dataclass(frozen=True, slots=True)
class IdentityOptions:
    """The identity options of one `verify` invocation, as given (nothing read or checked yet)."""

    certificate_chain: tuple[Path, ...] = ()
    identity: str | None = None
    identity_provider: str | None = None
    trusted_root: str | None = None

    @property
    def given(self) -> bool:
        """Whether any identity option was given."""
        return bool(self.certificate_chain) or any(
            v is not None for v in (self.identity, self.identity_provider, self.trusted_root)
        )

    def policy(
        self, keys: Sequence[Path], policy_file: Path | None, required: Sequence[Any], allow_remote_code: bool
    ) -> Any:
        """The command-line policy these options (and `keys`) build, or None when none was given.

        Raises:
            click.UsageError: With `--policy`, or a combination that means nothing.
            PolicyError: A `--certificate-chain` file holds no readable certificate, or no key or the
                authority can make a `required` signature (`ModelAdmission.requiring`).
            KeyMaterialError: A `--trusted-key` cannot be read or parsed.
        """
        if not self.given:
            return None
        if policy_file is not None:
            raise click.UsageError(
                "--certificate-chain, --identity, --identity-provider and --trusted-root build a policy: "
                "give them or --policy, not both (write the identity into the policy file's authorities)"
            )
        from modelsec.policy import Policy
        from modelsec.signer.keys import load_trusted_key_file
        from modelsec.verifier.admission import ModelAdmission

        authority = self._authority()
        policy = Policy(
            keys=tuple(load_trusted_key_file(p) for p in keys),
            authorities=(authority,),
            allow_remote_code=allow_remote_code,
        )
        return ModelAdmission.of(policy).requiring(required)

    def _authority(self) -> Any:
        from modelsec.policy import IdentityRule, SigstoreAuthority, X509Authority
        from modelsec.policy.trust import read_root_ders

        if self.certificate_chain:
            for option, value in (
                ("--identity-provider", self.identity_provider),
                ("--trusted-root", self.trusted_root),
            ):
                if value is not None:
                    raise click.UsageError(
                        f"{option} is for keyless (Sigstore) verification; it does not apply to "
                        "--certificate-chain (give --identity to constrain the certificate's SAN)"
                    )
            roots = [
                der
                for i, path in enumerate(self.certificate_chain)
                for der in read_root_ders(path, f"--certificate-chain[{i}]")
            ]
            rule = IdentityRule(identity=self.identity)
            return X509Authority("certificate-chain", tuple(roots), (rule,), frozenset())
        if self.identity is None or self.identity_provider is None:
            missing = "--identity" if self.identity is None else "--identity-provider"
            raise click.UsageError(
                f"keyless verification needs --identity and --identity-provider (missing {missing}); "
                "for certificate mode give --certificate-chain ROOT.pem"
            )
        root = self.trusted_root or "production"
        if root not in _ROOT_NAMES and not Path(root).is_file():
            raise click.BadParameter(
                f"{root!r} is neither production, staging nor a trusted_root.json file",
                param_hint="--trusted-root",
            )
        rule = IdentityRule(identity=self.identity, issuer=self.identity_provider)
        return SigstoreAuthority(f"keyless ({root})", root, (rule,), frozenset())


def identity_options(f: F) -> F:
    """Add the identity options to a command; it receives them as one `identity: IdentityOptions`."""

    @functools.wraps(f)
    def wrapper(
        *args: Any,
        certificate_chain: tuple[Path, ...],
        identity: str | None,
        identity_provider: str | None,
        trusted_root: str | None,
        **kwargs: Any,
    ) -> Any:
        options = IdentityOptions(certificate_chain, identity, identity_provider, trusted_root)
        return f(*args, identity=options, **kwargs)

    decorators = (
        click.option(
            "--certificate-chain",
            "certificate_chain",
            type=click.Path(path_type=Path),
            multiple=True,
            metavar="PEM",
            help="Trust bundles whose X.509 chain leads to a certificate in this PEM file (repeatable; "
            "model_signing's certificate method). The bundle's own certificates are never trusted alone.",
        ),
        click.option(
            "--identity",
            metavar="ID",
            help="The identity the signing certificate must name (SAN URI or email, exact): with "
            "--certificate-chain, or with --identity-provider for keyless Sigstore bundles.",
        ),
        click.option(
            "--identity-provider",
            "identity_provider",
            metavar="ISSUER",
            help="Keyless: the OIDC issuer of the signing identity (e.g. https://accounts.google.com).",
        ),
        click.option(
            "--trusted-root",
            "trusted_root",
            metavar="production|staging|FILE",
            help="Keyless: the Sigstore trusted root, embedded (default production) or a trusted_root.json; "
            "verification is offline.",
        ),
    )
    decorated: Any = wrapper
    for decorator in reversed(decorators):
        decorated = decorator(decorated)
    return decorated  # type: ignore[no-any-return]
