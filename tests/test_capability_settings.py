"""Seed 001's capability settings: ``user_guidance`` in the registry, dependencies between
capabilities (``requires``), and the validated ``capability_config`` of ``capabilities.yaml``
(model, limits, allowed/forbidden operations, auto_enable) — end to end through the bus with the
scripted model, the real sandbox and the registry projection."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.capabilities import CapabilityError, parse_module
from nanocrab.capabilities.config import (
    CapabilityConfig,
    CapabilityConfigError,
    capabilities_file,
    load_capability_config,
    parse_capability_config,
)
from nanocrab.capabilities.deps import Node, blocked, chain, cycle, dependents, problems, to_enable
from nanocrab.cli.capabilities import EnableRefused, _dependents_or_exit, enable_events
from nanocrab.cli.wiring import CapabilityCatalogue
from nanocrab.events import (
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityRegistered,
    CapabilityRemoved,
    CapabilityTested,
)
from nanocrab.handlers.capgen import CapgenHandler, check_module
from nanocrab.projections import capability, list_capabilities
from nanocrab.sandbox import Sandbox
from nanocrab.tools.base import ToolError
from nanocrab.tools.capability import CapabilityArgs, CapabilityTool
from tests.test_capability_tool import ctx
from tests.test_capgen import WORD_COUNT_V1, Recording, block, generate, of, project, provider
from tests.test_capgen import sandbox as sandbox  # the session fixture

pytestmark = pytest.mark.timeout(180)

SENTENCES = """
import re

CAPABILITY = {
    "name": "sentence_stats",
    "version": "0.1.0",
    "description": "Count the sentences of a text.",
    "entry": "run",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "permissions": [],
    "user_guidance": "Pass the whole text; use word_count for words.",
    "requires": ["word_count"],
}


def run(text):
    return {"sentences": len([s for s in re.split(r"[.!?]+", text) if s.strip()])}


def test_two():
    assert run(text="A b. C d!") == {"sentences": 2}


def test_none():
    assert run(text="") == {"sentences": 0}
"""

READS_FILES = WORD_COUNT_V1.replace('"permissions": [],', '"permissions": ["fs.read"],').replace(
    "def test_empty():",
    "def test_reads():\n    try:\n        open('x.txt').read()\n    except OSError:\n"
    "        pass\n\n\ndef test_empty():",
)


# --- capabilities.yaml --------------------------------------------------------------------------


def test_the_capability_config_section_is_typed_and_defaults_without_a_file(
    tmp_path: Path,
) -> None:
    assert load_capability_config(None) == CapabilityConfig()
    assert capabilities_file(tmp_path, {}) is None
    (tmp_path / "capabilities.yaml").write_text(
        "version: 1\n"
        "capability_config:\n"
        "  model: claude-x\n"
        "  auto_enable: true\n"
        "  limits:\n"
        "    max_source_bytes: 4096\n"
        "    test_timeout_s: 2\n"
        "    test_memory_mb: 64\n"
        "    max_capabilities: 3\n"
        "  forbidden_operations: [fs.write]\n"
    )
    path = capabilities_file(tmp_path, {})
    assert path == tmp_path / "capabilities.yaml"
    config = load_capability_config(path)
    assert config.model == "claude-x" and config.auto_enable
    assert config.permitted == {"fs.read"}
    assert config.limits.tests().timeout_s == 2 and config.limits.tests().memory_bytes == 64 << 20
    why = config.why_refused(["fs.read", "fs.write"])
    assert why is not None and "'fs.write'" in why and "forbidden_operations" in why
    assert config.why_refused(["fs.read"]) is None
    with pytest.raises(CapabilityConfigError, match="NANOCRAB_CAPABILITIES=/nope: no such file"):
        capabilities_file(tmp_path, {"NANOCRAB_CAPABILITIES": "/nope"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "version: 1\ncapability_config:\n  limits:\n    test_timeout: 3\n",
            "caps.yaml:4: capability_config.limits.test_timeout: Extra inputs are not permitted",
        ),
        ("version: 1\nsandbox: {}\n", "caps.yaml:2: sandbox: Extra inputs are not permitted"),
        (
            "capability_config:\n  allowed_operations: [file_read]\n",
            "caps.yaml:2: capability_config.allowed_operations: Value error, 'file_read' is "
            "seed 001's name: write 'fs.read'",
        ),
        (
            "capability_config:\n  forbidden_operations: [fs.read, exec]\n",
            "caps.yaml:2: capability_config.forbidden_operations: Value error, unknown operation "
            "'exec': use fs.read, fs.write, net",
        ),
        (
            "capability_config:\n  allowed_operations: [fs.read]\n"
            "  forbidden_operations: [fs.read]\n",
            "fs.read is both allowed and forbidden",
        ),
        (
            "capability_config:\n  limits:\n    max_source_bytes: 100000\n",
            "caps.yaml:3: capability_config.limits.max_source_bytes: Input should be less than "
            "or equal to 65536",
        ),
        ("capability_config:\n  auto_enable: maybe\n", "caps.yaml:2: capability_config.auto"),
        (
            "capability_config:\n  api_key: sk-123\n",
            "caps.yaml:2: capability_config: Value error, api_key is seed 001's setting: drop it: "
            "keys come from the environment",
        ),
        ("- a\n", "caps.yaml:1: capabilities.yaml is a mapping"),
        ("capability_config:\n  model: a\n  model: b\n", "caps.yaml:3: duplicate key 'model'"),
    ],
)
def test_a_bad_capabilities_file_is_refused_with_file_and_line(text: str, expected: str) -> None:
    with pytest.raises(CapabilityConfigError) as caught:
        parse_capability_config(text, "caps.yaml")
    assert expected in str(caught.value)


# --- the module's declaration -----------------------------------------------------------------


def test_a_module_declares_its_guidance_and_what_it_requires() -> None:
    spec = parse_module(SENTENCES).spec
    assert spec.user_guidance == "Pass the whole text; use word_count for words."
    assert spec.requires == ("word_count",)
    assert parse_module(WORD_COUNT_V1).spec.requires == ()
    itself = SENTENCES.replace('"requires": ["word_count"]', '"requires": ["sentence_stats"]')
    with pytest.raises(CapabilityError, match="cannot require itself"):
        parse_module(itself)
    bad = SENTENCES.replace('"requires": ["word_count"]', '"requires": ["Word Count"]')
    with pytest.raises(CapabilityError, match="'Word Count' is not a capability name") as caught:
        parse_module(bad)
    assert caught.value.line == SENTENCES.splitlines().index('    "requires": ["word_count"],') + 1


# --- dependencies as data -----------------------------------------------------------------------


def test_dependency_chains_dependents_and_cycles() -> None:
    registry = {
        "a": Node(enabled=True),
        "b": Node(enabled=False, requires=("a",)),
        "c": Node(enabled=True, requires=("b",)),
        "d": Node(enabled=True, requires=("gone", "c")),
        "gone": Node(enabled=False, removed=True),
    }
    assert chain(registry, "c") == ["a", "b"]
    assert problems(registry, "a") == [] and problems(registry, "c") == ["'b' is disabled"]
    assert problems(registry, "d") == ["'gone' is removed", "'b' is disabled"]
    assert to_enable(registry, "c") == (["b"], [])
    assert to_enable(registry, "d") == (["b"], ["'gone' is removed"])
    assert dependents(registry, "a") == ["c", "d"], "b is disabled; c and d need a through it"
    assert dependents(registry, "d") == []
    assert cycle(registry, "a", ["c"]) == ["a", "c", "b", "a"]
    assert cycle(registry, "e", ["c"]) is None
    looped = {"x": Node(enabled=True, requires=("y",)), "y": Node(enabled=True, requires=("x",))}
    assert problems(looped, "x") == ["the dependencies form a cycle: x → y → x"]
    config = CapabilityConfig(forbidden_operations=("fs.write",))
    why = blocked(registry, "c", ["fs.write"], config)
    assert "it requires 'b' is disabled" in why and "'fs.write'" in why
    assert blocked(registry, "a", [], config) == ""


def test_static_checks_apply_the_configured_limits_operations_and_registry() -> None:
    strict = CapabilityConfig(
        forbidden_operations=("fs.read",),
        limits={"max_source_bytes": 512, "max_capabilities": 1},  # type: ignore[arg-type]
    )

    def rules(source: str, registry: dict[str, Node] | None = None) -> list[str]:
        verdict = check_module(source, config=strict, registry=registry)
        return [f.rule for f in verdict.findings if f.severity == "error"]

    assert rules(WORD_COUNT_V1) == ["too_large"]
    small = CapabilityConfig(forbidden_operations=("fs.read",))
    verdict = check_module(READS_FILES, config=small)
    (forbidden,) = [f for f in verdict.findings if f.rule == "permission_forbidden"]
    assert "'fs.read'" in forbidden.message and "capabilities.yaml" in forbidden.message
    assert check_module(READS_FILES).ok, "the defaults permit fs.read"

    roomy = CapabilityConfig(limits={"max_capabilities": 1})  # type: ignore[arg-type]

    def registry_rules(registry: dict[str, Node]) -> list[str]:
        verdict = check_module(SENTENCES, config=roomy, registry=registry)
        return [f.rule for f in verdict.findings if f.severity == "error"]

    assert registry_rules({}) == ["requires_unknown"]
    assert registry_rules({"word_count": Node(enabled=False, removed=True)}) == ["requires_unknown"]
    assert registry_rules({"word_count": Node(enabled=False)}) == ["registry_full"]
    assert registry_rules({"word_count": Node(enabled=False, requires=("sentence_stats",))}) == [
        "requires_cycle",
        "registry_full",
    ]
    assert check_module(SENTENCES, registry={"word_count": Node(enabled=False)}).ok


# --- end to end through the bus -------------------------------------------------------------------


async def test_forbidden_operations_are_refused_at_registration_and_the_model_is_told(
    log: EventLog, sandbox: Sandbox
) -> None:
    config = CapabilityConfig(forbidden_operations=("fs.read",), model="gen-model", max_tokens=900)
    model = Recording(provider({"count": [block(READS_FILES), block(WORD_COUNT_V1)]}))
    handler = CapgenHandler(log, provider=model, sandbox=sandbox, config=config)
    events = await generate(log, handler, "count words", attempts=2)
    first, second = of(events, CapabilityTested)
    assert not first.passed and "permission_forbidden" in [f.rule for f in first.findings]
    assert first.tests == [], "a refused module never runs"
    assert second.passed and second.final
    (registered,) = of(events, CapabilityRegistered)
    assert registered.permissions == [] and registered.user_guidance == "count words"
    request = model.requests[0]
    assert request.model == "gen-model" and request.max_tokens == 900
    assert "This installation permits only: fs.write." in request.system
    feedback = model.requests[1].messages[-1].content[0]
    assert "[permission_forbidden]" in getattr(feedback, "text", "")


async def test_auto_enable_enables_a_new_capability_only_when_its_dependencies_are(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine
) -> None:
    scripts = {"count": [block(WORD_COUNT_V1)], "sentences": [block(SENTENCES)]}
    plain = CapgenHandler(log, provider=provider(scripts), sandbox=sandbox)
    assert not of(await generate(log, plain, "count words"), CapabilityEnabled)

    auto = CapabilityConfig(auto_enable=True)
    handler = CapgenHandler(log, provider=provider(scripts), sandbox=sandbox, config=auto)
    events = await generate(log, handler, "sentences please")
    (registered,) = of(events, CapabilityRegistered)
    assert registered.requires == ["word_count"]
    assert registered.user_guidance == "Pass the whole text; use word_count for words."
    assert not of(events, CapabilityEnabled), "word_count is disabled: no auto-enable"

    await log.append(CapabilityEnabled(name="word_count", version="0.1.0", source="cli"))
    await log.append(CapabilityRemoved(name="sentence_stats", source="cli"))
    events = await generate(log, handler, "sentences please")
    (enabled,) = of(events, CapabilityEnabled)
    (registered,) = of(events, CapabilityRegistered)
    assert (enabled.name, enabled.reason, enabled.requires) == (
        "sentence_stats", "auto_enable", ["word_count"],
    )  # fmt: skip
    assert enabled.source == "capgen" and enabled.causation_id == registered.causation_id
    await project(log, sqlite_engine)
    detail = await capability(sqlite_engine, "sentence_stats")
    assert detail is not None and detail.row.status == "enabled"
    assert detail.row.requires == ["word_count"]


async def test_dependencies_govern_enable_disable_remove_and_invocation(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    scripts = {"count": [block(WORD_COUNT_V1)], "sentences": [block(SENTENCES)]}
    handler = CapgenHandler(log, provider=provider(scripts), sandbox=sandbox)
    orphan = await generate(log, handler, "sentences please", attempts=1)
    assert not of(orphan, CapabilityRegistered), "it requires what is not registered"
    (verdict,) = of(orphan, CapabilityTested)
    (finding,) = [f for f in verdict.findings if f.severity == "error"]
    assert finding.rule == "requires_unknown" and "generate word_count first" in finding.message
    await generate(log, handler, "count words")
    assert of(await generate(log, handler, "sentences please"), CapabilityRegistered)

    async def rows() -> dict[str, object]:
        await project(log, sqlite_engine)
        return {r.name: r for r in await list_capabilities(sqlite_engine, include_removed=True)}

    registry = await rows()
    sentences = registry["sentence_stats"]
    assert sentences.requires == ["word_count"]  # type: ignore[attr-defined]
    assert sentences.user_guidance.startswith("Pass the whole text")  # type: ignore[attr-defined]
    config = CapabilityConfig()

    # enabling with a disabled dependency: refused, unless with its dependencies
    with pytest.raises(EnableRefused, match=r"requires word_count, not enabled.*--with-deps"):
        enable_events(sentences, registry, config)  # type: ignore[arg-type]
    for event in enable_events(sentences, registry, config, with_deps=True):  # type: ignore[arg-type]
        await log.append(event)
    registry = await rows()
    assert [registry[n].status for n in ("word_count", "sentence_stats")] == ["enabled"] * 2  # type: ignore[attr-defined]

    # disabling or removing what others require: refused unless forced
    with pytest.raises(typer.Exit):
        _dependents_or_exit("word_count", registry, force=False, what="disabled")  # type: ignore[arg-type]
    found = _dependents_or_exit("word_count", registry, force=True, what="disabled")  # type: ignore[arg-type]
    assert found == ["sentence_stats"]
    await log.append(
        CapabilityDisabled(
            name="word_count", version="0.1.0", forced=True, dependents=found, source="cli"
        )
    )
    await rows()

    # invoking checks the chain: listed as unavailable, refused when called
    catalogue = CapabilityCatalogue(sqlite_engine, config)
    cap = await catalogue.lookup("sentence_stats")
    assert cap is not None and "it requires 'word_count' is disabled" in cap.blocked
    tool = CapabilityTool(sandbox, lookup=catalogue.lookup, catalogue=catalogue.enabled)
    with pytest.raises(ToolError) as refused:
        await tool.run(
            CapabilityArgs(name="sentence_stats", arguments={"text": "A. B."}), ctx(tmp_path)
        )
    assert refused.value.kind == "denied" and "'word_count' is disabled" in refused.value.message
    listed = await tool.run(CapabilityArgs(name="list"), ctx(tmp_path))
    text = listed.content[0].text  # type: ignore[union-attr]
    assert "guidance: Pass the whole text; use word_count for words." in text
    assert "requires: word_count" in text and "unavailable: it requires" in text

    await log.append(CapabilityEnabled(name="word_count", version="0.1.0", source="cli"))
    await rows()
    ran = await tool.run(
        CapabilityArgs(name="sentence_stats", arguments={"text": "A. B."}), ctx(tmp_path)
    )
    assert not ran.is_error and '"sentences": 2' in ran.content[0].text  # type: ignore[union-attr]


async def test_enable_follows_enable_dependencies_and_the_permitted_operations(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine
) -> None:
    scripts = {"count": [block(READS_FILES)], "sentences": [block(SENTENCES)]}
    handler = CapgenHandler(log, provider=provider(scripts), sandbox=sandbox)
    await generate(log, handler, "count words")
    await generate(log, handler, "sentences please")
    await project(log, sqlite_engine)
    rows = {r.name: r for r in await list_capabilities(sqlite_engine)}
    assert rows["word_count"].permissions == ["fs.read"]

    cascade = CapabilityConfig(enable_dependencies=True)
    events = enable_events(rows["sentence_stats"], rows, cascade)
    assert [(e.name, e.required_by) for e in events] == [  # type: ignore[attr-defined]
        ("word_count", "sentence_stats"), ("sentence_stats", ""),
    ]  # fmt: skip
    no_reads = CapabilityConfig(enable_dependencies=True, forbidden_operations=("fs.read",))
    with pytest.raises(EnableRefused, match=r"its dependency word_count: it declares 'fs\.read'"):
        enable_events(rows["sentence_stats"], rows, no_reads)
    with pytest.raises(EnableRefused, match=r"word_count is not enabled: it declares 'fs\.read'"):
        enable_events(rows["word_count"], rows, no_reads)
    for event in enable_events(rows["sentence_stats"], rows, cascade):
        await log.append(event)
    await project(log, sqlite_engine)
    catalogue = CapabilityCatalogue(sqlite_engine, no_reads)
    word_count = await catalogue.lookup("word_count")
    assert word_count is not None and "forbidden_operations lists it" in word_count.blocked
    sentences = await catalogue.lookup("sentence_stats")
    assert sentences is not None and sentences.blocked == "", "its own chain is enabled"

    # what `capabilities list` and `show` print
    from rich.console import Console

    from nanocrab.cli.capabilities_render import detail_json, detail_view, registry_table
    from nanocrab.projections import capability_stats

    console = Console(width=240, record=True)
    rows = {r.name: r for r in await list_capabilities(sqlite_engine)}
    stats = {n: await capability_stats(sqlite_engine, n) for n in rows}
    console.print(registry_table(list(rows.values()), stats))
    detail = await capability(sqlite_engine, "word_count")
    assert detail is not None
    console.print(detail_view(detail, stats["word_count"], required_by=["sentence_stats"]))
    lines = console.export_text().splitlines()
    (listed,) = [line for line in lines if line.lstrip("│ ").startswith("sentence_stats")]
    assert "word_count" in listed, "its requires column"
    assert any("Pass the whole text; use word_count for words." in line for line in lines)
    assert any(line.startswith("required by") and "sentence_stats" in line for line in lines)
    assert any(line.startswith("guidance") and "count words" in line for line in lines)
    shown = detail_json(detail, stats["word_count"])
    assert (shown["user_guidance"], shown["requires"]) == ("count words", [])


# --- the CLI ---------------------------------------------------------------------------------------


def test_the_cli_refuses_a_bad_capabilities_file_with_its_line(tmp_path: Path) -> None:
    from tests.test_cli import cli

    home = tmp_path / "home"
    home.mkdir()
    (home / "capabilities.yaml").write_text(
        "version: 1\ncapability_config:\n  auto_enable: true\n  limits:\n    timeout: 5\n"
    )
    for args in (
        ("capabilities", "enable", "word_count"),
        ("capabilities", "generate", "count words"),
        ("capabilities", "invoke", "word_count", "--args", "{}"),
    ):
        result = cli(home, *args)
        said = " ".join(result.stderr.split())
        assert result.returncode == 2, result.stdout + result.stderr
        assert "capabilities.yaml:5: capability_config.limits.timeout: Extra inputs" in said
        assert "Traceback" not in result.stderr


async def test_generate_enable_leaves_a_capability_whose_dependencies_are_disabled(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine
) -> None:
    from nanocrab.cli.capgen import _follow
    from nanocrab.cli.host import Host
    from nanocrab.events import CapabilityRequested
    from tests.test_capgen import FAST

    scripts = {"count": [block(WORD_COUNT_V1)], "sentences": [block(SENTENCES)]}
    handler = CapgenHandler(log, provider=provider(scripts), sandbox=sandbox)
    host = Host(log, sqlite_engine, [handler], projections=[], options=FAST)
    await host.start()
    try:
        first = CapabilityRequested(name="", guidance="count words", max_attempts=1)
        assert await _follow(log, first, 90, True, enable=False) == 0
        second = CapabilityRequested(name="", guidance="sentences please", max_attempts=1)
        assert await _follow(log, second, 90, True, enable=True) == 0
    finally:
        await host.stop(drain_s=5)
    await project(log, sqlite_engine)
    statuses = {r.name: r.status for r in await list_capabilities(sqlite_engine)}
    assert statuses == {"word_count": "disabled", "sentence_stats": "disabled"}


def test_the_documented_file_is_valid_and_shows_the_defaults() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "sandbox.md").read_text()
    section = doc.split("## Capability settings, guidance and dependencies")[1]
    text = section.split("```yaml\n")[1].split("```")[0]
    assert parse_capability_config(text, "sandbox.md") == CapabilityConfig()


def test_capabilities_settings_prints_the_config_in_effect(tmp_path: Path) -> None:
    import json

    from tests.test_cli import cli

    home = tmp_path / "home"
    home.mkdir()
    default = cli(home, "capabilities", "settings", "--json")
    assert default.returncode == 0, default.stderr
    shown = json.loads(default.stdout)
    assert shown["file"] is None and shown["capability_config"]["auto_enable"] is False
    (home / "capabilities.yaml").write_text(
        "capability_config:\n  auto_enable: true\n  forbidden_operations: [fs.write]\n"
    )
    pretty = cli(home, "capabilities", "settings")
    assert pretty.returncode == 0, pretty.stderr
    assert "permitted operations: fs.read" in pretty.stdout
    assert "auto_enable: true" in pretty.stdout
    (home / "capabilities.yaml").write_text("capability_config:\n  auto_enable: 3\n")
    bad = cli(home, "capabilities", "settings")
    assert bad.returncode == 2 and "capabilities.yaml:2: capability_config.auto_enable" in " ".join(
        bad.stderr.split()
    )
