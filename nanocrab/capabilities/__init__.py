"""Capabilities: generated single-file Python modules, parsed and statically scanned before use."""

from nanocrab.capabilities.module import (
    CapabilityError,
    CapabilityErrorKind,
    CapabilitySpec,
    ParsedModule,
    content_hash,
    parse_module,
)
from nanocrab.capabilities.rules import ALLOWED_MODULES, PERMISSIONS, RULES
from nanocrab.capabilities.scan import (
    Finding,
    Permission,
    SafetyLevel,
    ScanReport,
    Severity,
    scan,
)

__all__ = [
    "ALLOWED_MODULES",
    "PERMISSIONS",
    "RULES",
    "CapabilityError",
    "CapabilityErrorKind",
    "CapabilitySpec",
    "Finding",
    "ParsedModule",
    "Permission",
    "SafetyLevel",
    "ScanReport",
    "Severity",
    "content_hash",
    "parse_module",
    "scan",
]
