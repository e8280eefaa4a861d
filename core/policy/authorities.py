"""The certificate and Sigstore authorities of a policy (DESIGN.md decision 12), and how a file names them.

Split from `modelsec.policy` (which re-exports the classes): what an `authorities` entry of a policy file
becomes once its root files are read and its identity patterns compiled.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modelsec.errors import PolicyError
from modelsec.policy.trust import read_root_ders

if TYPE_CHECKING:  # pydantic is imported when a file is parsed
    from modelsec.policy.models import AuthorityModel, IdentityModel

__all__ = ["Authority", "IdentityRule", "SigstoreAuthority", "X509Authority", "authority_from_model"]


@dataclass(frozen=True, slots=True)
class IdentityRule:
    """Who a certificate must name: a SAN (exact or a full regular-expression match) and an OIDC issuer.

    The identity is matched against the leaf's SAN URIs, emails and Sigstore `otherName`s; the issuer
    against Fulcio's OIDC-issuer extension (1.3.6.1.4.1.57264.1.8, or the older .1.1). Regular expressions
    must match the whole value (`re.fullmatch`), unlike cosign's `--certificate-identity-regexp`, which
    searches: `.*` must be written out where a prefix or suffix is meant.

    Attributes:
        identity: The exact SAN, or None when `identity_regexp` is given.
        identity_regexp: A pattern the whole SAN must match, or None.
        issuer: The exact OIDC issuer, or None.
        issuer_regexp: A pattern the whole issuer must match, or None (neither: any or no issuer).
    """

    identity: str | None = None
    identity_regexp: re.Pattern[str] | None = None
    issuer: str | None = None
    issuer_regexp: re.Pattern[str] | None = None

    def __str__(self) -> str:
        who = self.identity or f"~{self.identity_regexp.pattern if self.identity_regexp else ''}"
        by = self.issuer or (f"~{self.issuer_regexp.pattern}" if self.issuer_regexp else "")
        return f"{who} (issuer {by})" if by else who


@dataclass(frozen=True, slots=True)
class X509Authority:
    """A certificate authority: bundles whose X.509 chain leads to one of `roots` and names an identity.

    Attributes:
        name: Names the authority in diagnostics.
        roots: The trusted root certificates (DER), read from the policy's PEM files.
        identities: The leaf must match at least one.
        roles: What signers it vouches for may sign (`weights`, `watermark`, `gate`); empty means all.
        allow_ca_leaf: Accept a signing certificate that asserts `CA:TRUE` (policy `allowCaLeaf`), only with
            a key usage that has digitalSignature and an extended key usage that has codeSigning. Default:
            refused by the end-entity profile (RFC 5280 section 4.2.1.9; CA/B Forum).
    """

    name: str
    roots: tuple[bytes, ...] = field(repr=False)
    identities: tuple[IdentityRule, ...]
    roles: frozenset[str] = frozenset()
    allow_ca_leaf: bool = False

    def may(self, role: str) -> bool:
        """Whether identities of this authority may sign statements of `role`."""
        return not self.roles or role in self.roles


@dataclass(frozen=True, slots=True)
class SigstoreAuthority:
    """A Sigstore instance: keyless bundles (Fulcio certificate, Rekor entry) verified offline.

    Attributes:
        name: Names the authority in diagnostics.
        trusted_root: `production` or `staging` (the roots embedded in the `sigstore` package) or the path
            of a `trusted_root.json`.
        identities: The signing certificate must match at least one (each with an issuer).
        roles: What signers it vouches for may sign; empty means all.
    """

    name: str
    trusted_root: str
    identities: tuple[IdentityRule, ...]
    roles: frozenset[str] = frozenset()

    def may(self, role: str) -> bool:
        """Whether identities of this authority may sign statements of `role`."""
        return not self.roles or role in self.roles


Authority = X509Authority | SigstoreAuthority


def authority_from_model(item: AuthorityModel, where: str, base_dir: Path) -> Authority:
    """A validated `authorities` entry: root files read, patterns compiled, a trusted-root file resolved."""
    roles = frozenset[str](item.roles)
    if item.x509 is not None:
        roots: list[bytes] = []
        for k, path in enumerate(item.x509.roots):
            roots.extend(read_root_ders(base_dir / path, f"{where}.x509.roots[{k}]"))
        rules = tuple(
            _identity_rule(r.san, r.san_regexp, r, f"{where}.x509.identities[{k}]")
            for k, r in enumerate(item.x509.identities)
        )
        return X509Authority(item.name, tuple(roots), rules, roles, allow_ca_leaf=item.x509.allow_ca_leaf)
    if item.sigstore is None:  # refused by the model already; kept as a fail-closed guard
        raise PolicyError(f"{where}: give x509 or sigstore")
    root = item.sigstore.trusted_root
    if root not in ("production", "staging"):
        root = str(base_dir / root)
        if not os.path.isfile(root):
            raise PolicyError(f"{where}.sigstore.trustedRoot: {root} is not a file")
    rules = tuple(
        _identity_rule(r.identity, r.identity_regexp, r, f"{where}.sigstore.identities[{k}]")
        for k, r in enumerate(item.sigstore.identities)
    )
    return SigstoreAuthority(item.name, root, rules, roles)


def _identity_rule(exact: str | None, pattern: str | None, item: IdentityModel, where: str) -> IdentityRule:
    return IdentityRule(
        identity=exact,
        identity_regexp=_compile(pattern, where),
        issuer=item.issuer,
        issuer_regexp=_compile(item.issuer_regexp, where),
    )


def _compile(pattern: str | None, where: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise PolicyError(f"{where}: {pattern!r} is not a regular expression: {e}") from e
