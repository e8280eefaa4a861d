"""The operator's policy: trusted keys and authorities, TSAs and key windows, requirements, limits, patterns.

`policies` holds `Policy` (one policy) and `PolicySet` (a policy file: several policies matched by model
URI and namespace); `authorities`, `requirements` and `trust` hold the parts a policy is made of. This face
exports what callers use. The parts load their modules on first use (PEP 562): the loader imports
`Policy`, and every process the runtime guard starts pays for what this package imports (issue 32 item 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelsec.lazy import lazy_exports
from modelsec.policy.policies import (
    API_VERSION,
    POLICY_ENV,
    ROLES,
    NamespaceRule,
    Policy,
    PolicySet,
    model_uri,
)

if TYPE_CHECKING:
    from modelsec.policy.authorities import Authority, IdentityRule, SigstoreAuthority, X509Authority
    from modelsec.policy.requirements import RobustnessRequirement, WatermarkRequirement
    from modelsec.policy.trust import KeyWindow, TimestampAuthority, check_validity_window

__all__ = [
    "API_VERSION",
    "POLICY_ENV",
    "ROLES",
    "Authority",
    "IdentityRule",
    "KeyWindow",
    "NamespaceRule",
    "Policy",
    "PolicySet",
    "RobustnessRequirement",
    "SigstoreAuthority",
    "TimestampAuthority",
    "WatermarkRequirement",
    "X509Authority",
    "check_validity_window",
    "model_uri",
]

_HOMES = {
    "Authority": "authorities",
    "IdentityRule": "authorities",
    "SigstoreAuthority": "authorities",
    "X509Authority": "authorities",
    "RobustnessRequirement": "requirements",
    "WatermarkRequirement": "requirements",
    "KeyWindow": "trust",
    "TimestampAuthority": "trust",
    "check_validity_window": "trust",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals(), __all__)
