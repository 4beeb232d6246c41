"""A snapshot turned into what handlers use: the policy, the guardrails config, the agents and
the skill library of one configuration version.

A file the snapshot does not hold falls back to :class:`BaseConfig` — what the process was
started with (``NANOCRAB_POLICY``, the bundled defaults, ``~/.nanocrab/skills``) — so a
configuration directory holding only ``skills/`` changes skills and nothing else. Skills of the
snapshot's ``skills/`` come last, so they override bundled and user skills of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nanocrab.guardrails import GuardrailsConfig, load_guardrails
from nanocrab.policy import Policy, load_policy
from nanocrab.routing import AgentsConfig, load_agents
from nanocrab.skills import SkillLibrary


@dataclass(frozen=True, kw_only=True)
class BaseConfig:
    """What a version falls back to for the files its snapshot lacks (the start-up config).

    ``guardrails``: ``False`` when guardrails are off (``NANOCRAB_GUARDRAILS=none``): no
    version turns them on (the handler is not running)."""

    policy_file: Path | None = None
    guardrails_file: Path | None = None
    guardrails: bool = True
    agents_file: Path | None = None
    skill_dirs: tuple[Path, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LoadedConfig:
    """One configuration version, loaded. ``version`` is empty for the start-up config."""

    version: str
    policy: Policy
    guardrails: GuardrailsConfig | None
    guardrails_text: str | None
    agents: AgentsConfig | None
    skills: SkillLibrary
    prompts: dict[str, str] = field(default_factory=dict)
    root: Path | None = None

    @property
    def short(self) -> str:
        return self.version[:12] or "startup"


def load_config(version: str, root: Path | None, base: BaseConfig) -> LoadedConfig:
    """Load the version materialized at ``root`` (``None``: the start-up config alone).

    Raises the loaders' own errors (:class:`~nanocrab.policy.PolicyError`,
    :class:`~nanocrab.guardrails.GuardrailsError`, :class:`~nanocrab.routing.AgentsError`),
    each naming file and line; skill problems are in ``skills.problems`` (discovery never
    raises)."""

    def pick(name: str, fallback: Path | None) -> Path | None:
        if root is not None and (root / name).is_file():
            return root / name
        return fallback

    policy = load_policy(pick("policy.yaml", base.policy_file))
    guard_path = pick("guardrails.yaml", base.guardrails_file)
    guardrails = load_guardrails(guard_path) if base.guardrails else None
    guard_text = guard_path.read_text("utf-8") if base.guardrails and guard_path else None
    agents_path = pick("agents.yaml", base.agents_file)
    agents = load_agents(agents_path) if agents_path is not None else None
    dirs = [*base.skill_dirs]
    if root is not None and (root / "skills").is_dir():
        dirs.append(root / "skills")
    skills = SkillLibrary.discover(dirs)
    prompts: dict[str, str] = {}
    if root is not None and (root / "prompts").is_dir():
        for path in sorted((root / "prompts").rglob("*")):
            if path.is_file():
                prompts[path.relative_to(root / "prompts").as_posix()] = path.read_text(
                    "utf-8", errors="replace"
                )
    return LoadedConfig(
        version=version, policy=policy, guardrails=guardrails, guardrails_text=guard_text,
        agents=agents, skills=skills, prompts=prompts, root=root,
    )  # fmt: skip
