"""Dependencies between capabilities: what a capability ``requires`` must be enabled for it to be
enabled or invoked, and what depends on it when it is disabled or removed.

Pure functions over a registry snapshot (name → :class:`Node`), so the CLI, the generator and
the ``capability`` tool decide alike. A dependency is declared by name (``CAPABILITY["requires"]``)
and carried by ``capability.registered``; the chain is followed transitively, and a cycle is
itself a broken chain (the generator refuses to register one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nanocrab.capabilities.config import CapabilityConfig


@dataclass(frozen=True)
class Node:
    """One capability as dependencies see it."""

    enabled: bool
    removed: bool = False
    requires: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.enabled and not self.removed


Registry = Mapping[str, Node]


def chain(registry: Registry, name: str) -> list[str]:
    """Everything ``name`` requires, directly or not, dependencies first (``name`` excluded).
    Names the registry does not know are included: :func:`broken` says what is wrong."""
    order: list[str] = []
    seen = {name}

    def visit(current: str) -> None:
        node = registry.get(current)
        for dep in node.requires if node is not None else ():
            if dep not in seen:
                seen.add(dep)
                visit(dep)
                order.append(dep)

    visit(name)
    return order


def cycle(registry: Registry, name: str, requires: Iterable[str]) -> list[str] | None:
    """The path back to ``name`` if it declared ``requires`` (``[name, a, ..., name]``), or
    ``None`` when that would form no cycle."""
    stack: list[tuple[str, list[str]]] = [(dep, [name, dep]) for dep in sorted(requires)]
    seen: set[str] = set()
    while stack:
        current, path = stack.pop()
        if current == name:
            return path
        if current in seen:
            continue
        seen.add(current)
        node = registry.get(current)
        for dep in node.requires if node is not None else ():
            stack.append((dep, [*path, dep]))
    return None


def problems(registry: Registry, name: str) -> list[str]:
    """Why ``name``'s dependency chain is not all usable, one phrase per dependency that is
    missing, removed or disabled (dependencies first); ``[]`` when it is."""
    out: list[str] = []
    for dep in chain(registry, name):
        node = registry.get(dep)
        if node is None:
            out.append(f"{dep!r} is not registered")
        elif node.removed:
            out.append(f"{dep!r} is removed")
        elif not node.enabled:
            out.append(f"{dep!r} is disabled")
    looped = cycle(registry, name, registry[name].requires) if name in registry else None
    if looped is not None:
        out.append("the dependencies form a cycle: " + " → ".join(looped))
    return out


def to_enable(registry: Registry, name: str) -> tuple[list[str], list[str]]:
    """What enabling ``name`` with its dependencies takes: the disabled dependencies to enable
    first (in order), and what cannot be fixed by enabling (missing or removed ones, a cycle)."""
    enable: list[str] = []
    fatal: list[str] = []
    for dep in chain(registry, name):
        node = registry.get(dep)
        if node is None:
            fatal.append(f"{dep!r} is not registered")
        elif node.removed:
            fatal.append(f"{dep!r} is removed")
        elif not node.enabled:
            enable.append(dep)
    looped = cycle(registry, name, registry[name].requires) if name in registry else None
    if looped is not None:
        fatal.append("the dependencies form a cycle: " + " → ".join(looped))
    return enable, fatal


def dependents(registry: Registry, name: str) -> list[str]:
    """The usable (enabled, not removed) capabilities that require ``name``, directly or not,
    sorted: what disabling or removing it would leave with a broken chain."""
    found: set[str] = set()
    frontier = [name]
    while frontier:
        target = frontier.pop()
        for other, node in registry.items():
            if other not in found and other != name and target in node.requires:
                found.add(other)
                frontier.append(other)
    return sorted(n for n in found if registry[n].usable)


def blocked(
    registry: Registry, name: str, permissions: Iterable[str], config: CapabilityConfig
) -> str:
    """Why enabled capability ``name`` may not run now, or ``""``: a dependency in its chain
    that is not enabled, or a declared permission the configuration does not permit."""
    reasons = []
    if found := problems(registry, name):
        reasons.append("it requires " + "; ".join(found) + " (enable the dependencies first)")
    if refused := config.why_refused(list(permissions)):
        reasons.append(refused)
    return "; ".join(reasons)
