"""Finding the Python agent of a run: its declaration in the run's configuration version
(``agents.yaml`` with ``module:``) and the file of its code in that version."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanocrab.reload import ConfigView, LoadedConfig
from nanocrab.routing import AgentSpec


@dataclass(frozen=True, slots=True)
class PythonAgent:
    """A run's Python agent: its declaration and where its module is for the run's version."""

    spec: AgentSpec
    path: Path
    version: str


def module_dir(loaded: LoadedConfig, view: ConfigView) -> Path | None:
    """The directory the agents.yaml of ``loaded`` is in: module paths are relative to it."""
    if loaded.root is not None and (loaded.root / "agents.yaml").is_file():
        return loaded.root
    agents_file = view.base.agents_file
    return agents_file.parent if agents_file is not None else None


def python_agent(loaded: LoadedConfig, view: ConfigView, name: str) -> PythonAgent | None:
    """Agent ``name`` of configuration ``loaded`` when it is a Python agent, else ``None``."""
    if loaded.agents is None:
        return None
    spec = loaded.agents.agent(name)
    if spec is None or spec.module is None:
        return None
    base = module_dir(loaded, view) or Path.cwd()
    return PythonAgent(spec=spec, path=base / spec.module, version=loaded.version)


async def run_agent(view: ConfigView, agent: str, pin: str) -> PythonAgent | None:
    """The Python agent of a run of ``agent`` pinned to configuration version ``pin``."""
    loaded = await view.ensure(pin) if pin else view.versions[""]
    return python_agent(loaded, view, agent)
