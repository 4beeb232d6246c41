"""Loading a Python agent's code from its file.

A module is loaded under a name derived from the hash of its bytes, so two versions of one
file are two modules side by side: a run keeps the code it started with while the next run
loads the new version (``nanocrab/reload``). Loaded code is cached by path and hash; the files
of an activated configuration version never change (the view materializes them once), and the
start-up version's code is loaded once per process. Imports no bus: the smoke-test subprocess
uses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import threading
from pathlib import Path

from nanocrab.pyagent.api import Agent, AgentError, Loaded

_cache: dict[tuple[str, str, str], Loaded] = {}
_lock = threading.Lock()  # loads run in threads: one module executes once


class AgentLoadError(AgentError):
    """The module does not import, or holds no usable agent class."""


def load(path: Path, class_name: str | None = None) -> Loaded:
    """The agent in the module at ``path``: class ``class_name``, else the one subclass of
    :class:`Agent` the module defines (or a class named ``Agent`` in it). Cached by path and
    content hash. :class:`AgentLoadError` says what is wrong (the import's own exception is
    its cause). Thread-safe."""
    with _lock:
        return _load(path, class_name)


def _load(path: Path, class_name: str | None) -> Loaded:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AgentLoadError(f"{path}: cannot read the agent module: {exc.strerror}") from exc
    digest = hashlib.sha256(data).hexdigest()
    key = (str(path.resolve()), digest, class_name or "")
    found = _cache.get(key)
    if found is not None:
        return found
    name = f"nanocrab_agent_{path.stem}_{digest[:16]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise AgentLoadError(f"{path}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the agent's code: any error is its author's to read
            sys.modules.pop(name, None)
            raise AgentLoadError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    cls = _agent_class(module, path, class_name)
    try:
        instance = cls()
    except Exception as exc:
        raise AgentLoadError(
            f"{path}: {cls.__name__}() failed: {type(exc).__name__}: {exc}"
        ) from exc
    smoke = getattr(module, "smoke", None)
    if smoke is not None and not inspect.iscoroutinefunction(smoke):
        raise AgentLoadError(f"{path}: smoke must be an 'async def smoke(harness)'")
    loaded = Loaded(agent=instance, sha256=digest, path=str(path), smoke=smoke)
    _cache[key] = loaded
    return loaded


def _agent_class(module: object, path: Path, class_name: str | None) -> type[Agent]:
    if class_name is not None:
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            raise AgentLoadError(f"{path}: no class {class_name!r}")
    else:
        own = [
            c for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, Agent) and c is not Agent
            and c.__module__ == getattr(module, "__name__", "")
        ]  # fmt: skip
        if len(own) == 1:
            cls = own[0]
        elif isinstance(getattr(module, "Agent", None), type) and module.Agent is not Agent:  # type: ignore[attr-defined]
            cls = module.Agent  # type: ignore[attr-defined]
        else:
            why = "none" if not own else f"{len(own)}: {', '.join(c.__name__ for c in own)}"
            raise AgentLoadError(
                f"{path}: name the agent's class with 'class:' in agents.yaml (Agent "
                f"subclasses found: {why})"
            )
    if not inspect.iscoroutinefunction(getattr(cls, "handle", None)):
        raise AgentLoadError(f"{path}: {cls.__name__} has no 'async def handle(request, context)'")
    return cls
