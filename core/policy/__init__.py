"""The operator's policy: trusted keys and authorities, TSAs and key windows, requirements, limits, patterns.

`policies` holds `Policy` (one policy) and `PolicySet` (a policy file: several policies matched by model
URI and namespace); `authorities`, `requirements` and `trust` hold the parts a policy is made of. This face
exports what callers use.
"""

from __future__ import annotations

from modelsec.policy.authorities import Authority, IdentityRule, SigstoreAuthority, X509Authority
from modelsec.policy.policies import (
    API_VERSION,
    POLICY_ENV,
    ROLES,
    NamespaceRule,
    Policy,
    PolicySet,
    model_uri,
)
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
