"""The capability policy rules engine: ``policy.yaml`` rules and a pure ``evaluate``.

Load a policy with :func:`load_policy` (``None`` → the bundled, secure-by-default
``default.yaml``), then decide each tool call with :func:`evaluate`. No I/O beyond reading the
file and resolving paths; no bus, no asyncio — the policy handler wraps it.
"""

from nanocrab.policy.engine import CallResources, Decision, Request, evaluate
from nanocrab.policy.rules import Approval, Policy, PolicyError, Rule, load_policy

__all__ = [
    "Approval",
    "CallResources",
    "Decision",
    "Policy",
    "PolicyError",
    "Request",
    "Rule",
    "evaluate",
    "load_policy",
]
