"""The static half of vetting a generated module: size, metadata (name, version, parameters
schema, entry signature), the AST scan.

Every problem becomes a :class:`~nanocrab.events.CapabilityFinding` (typed data the model gets
back verbatim on the next attempt); nothing here raises for a bad module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nanocrab.capabilities import CapabilityError, ParsedModule, content_hash, parse_module, scan
from nanocrab.capabilities.config import FILE as CONFIG_FILE
from nanocrab.capabilities.config import CapabilityConfig
from nanocrab.capabilities.deps import Node, cycle
from nanocrab.events import CapabilityFinding, SafetyLevel

DEFAULTS = CapabilityConfig()
MAX_TESTS = DEFAULTS.limits.max_tests


@dataclass(frozen=True)
class StaticVerdict:
    """What the static checks made of one module. ``module`` is ``None`` when it did not parse;
    ``ok`` means nothing stands in the way of running its tests."""

    content_hash: str
    module: ParsedModule | None = None
    findings: list[CapabilityFinding] = field(default_factory=list)
    safety_level: SafetyLevel | None = None

    @property
    def ok(self) -> bool:
        return self.module is not None and not any(f.severity == "error" for f in self.findings)

    @property
    def name(self) -> str:
        return self.module.spec.name if self.module is not None else ""

    @property
    def version(self) -> str:
        return self.module.spec.version if self.module is not None else ""


def version_key(version: str) -> tuple[int, ...] | None:
    """``"1.2.10"`` → ``(1, 2, 10)``; ``None`` for anything that is not dotted numbers."""
    parts = version.split(".")
    if not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def check_module(
    source: str,
    *,
    name: str = "",
    registered: Mapping[str, str] | None = None,
    current: str | None = None,
    config: CapabilityConfig = DEFAULTS,
    registry: Mapping[str, Node] | None = None,
) -> StaticVerdict:
    """Vet ``source`` before anything runs it.

    ``name``: the name the request asked for ("" lets the module choose). ``registered``: the
    capability's registered versions (version → content hash); ``current``: its current
    version. A version number already registered with other code, or lower than the current
    one, is refused: versions are immutable and move forward. ``config``: the size, test and
    registry limits and the permitted operations (``capability_config``). ``registry``: every
    capability by name, for its ``requires`` (each must be registered and not removed, and form
    no cycle) and ``max_capabilities``; ``None`` skips those checks.
    """
    limit = config.limits.max_source_bytes
    if len(source.encode()) > limit:
        return StaticVerdict(
            content_hash=content_hash(source),
            findings=[_error("too_large", f"the module is over {limit} bytes ({CONFIG_FILE} "
                             "capability_config.limits.max_source_bytes)")],
        )  # fmt: skip
    try:
        module = parse_module(source)
    except CapabilityError as exc:
        return StaticVerdict(
            content_hash=content_hash(source),
            findings=[_error(exc.kind, exc.message, line=exc.line or 0)],
        )
    spec = module.spec
    findings: list[CapabilityFinding] = []
    if name and spec.name != name:
        findings.append(
            _error("wrong_name", f'CAPABILITY["name"] is {spec.name!r}; it must be {name!r}')
        )
    known = dict(registered or {})
    if spec.version in known and known[spec.version] != module.content_hash:
        findings.append(
            _error(
                "version_exists",
                f"version {spec.version} of {spec.name} is registered with other code; "
                "give the new code a higher version",
            )
        )
    elif spec.version not in known and current is not None:
        new, old = version_key(spec.version), version_key(current)
        if new is not None and old is not None and new <= old:
            findings.append(
                _error(
                    "version_not_newer",
                    f"version {spec.version} is not higher than the current {current}",
                )
            )
    if "net" in spec.permissions:
        findings.append(
            _error(
                "no_network",
                "the sandbox has no network: drop the 'net' permission and take the data as a "
                "parameter instead",
            )
        )
    refused = config.refused_permissions(set(spec.permissions) - {"net"})  # net: said above
    if refused:
        findings.append(
            _error(
                "permission_forbidden",
                f"the configuration does not permit {', '.join(map(repr, refused))} "
                f"({CONFIG_FILE} capability_config.allowed_operations/forbidden_operations): "
                "work without it (take the data as a parameter, return the result)",
            )
        )
    if registry is not None:
        findings.extend(_registry_findings(spec.name, spec.requires, config, registry))
    max_tests = config.limits.max_tests
    if not module.test_names:
        findings.append(_error("no_tests", "the module has no test_* functions"))
    elif len(module.test_names) > max_tests:
        findings.append(_error("too_many_tests", f"more than {max_tests} test_* functions"))
    report = scan(source, spec.permissions)
    for f in report.findings:
        findings.append(
            CapabilityFinding(
                rule=f.rule,
                message=f.message,
                line=f.line or 0,
                col=f.col or 0,
                severity="error" if f.severity == "error" else "warning",
            )
        )
    if not report.ok and not any(f.severity == "error" for f in findings):
        findings.append(_error("scan_refused", "the static scanner refused the module"))
    return StaticVerdict(
        content_hash=module.content_hash,
        module=module,
        findings=findings,
        safety_level=report.safety_level,
    )


def _registry_findings(
    name: str, requires: tuple[str, ...], config: CapabilityConfig, registry: Mapping[str, Node]
) -> list[CapabilityFinding]:
    out: list[CapabilityFinding] = []
    for dep in requires:
        node = registry.get(dep)
        if node is None or node.removed:
            state = "not registered" if node is None else "removed"
            out.append(
                _error(
                    "requires_unknown",
                    f"it requires {dep!r}, which is {state}: generate {dep} first, or drop it "
                    'from CAPABILITY["requires"]',
                )
            )
    looped = cycle(registry, name, requires)
    if looped is not None:
        out.append(
            _error(
                "requires_cycle",
                "its requires would form a cycle (" + " → ".join(looped) + "): drop one",
            )
        )
    cap = config.limits.max_capabilities
    live = sum(1 for other, node in registry.items() if not node.removed and other != name)
    existing = registry.get(name)
    if cap is not None and (existing is None or existing.removed) and live >= cap:
        out.append(
            _error(
                "registry_full",
                f"the registry holds {live} capabilities, the configured maximum ({CONFIG_FILE} "
                "capability_config.limits.max_capabilities): remove one first",
            )
        )
    return out


def _error(rule: str, message: str, *, line: int = 0) -> CapabilityFinding:
    return CapabilityFinding(rule=rule, message=message, line=line)
