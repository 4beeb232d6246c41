"""Skills for a task: requirements that hide a skill, the task-type → skills map,
``get_skills_for_task`` with the map, and ``nanocrab skills list|show|check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanocrab.skills import SkillLibrary, bundled_skills_dir
from nanocrab.skills.requires import Requirement, missing
from nanocrab.skills.taskmap import (
    BUNDLED,
    SkillMapError,
    load_skillmap,
    parse_skillmap,
)
from nanocrab.tools.discovery import SkillsForTaskTool


def write_skill(root: Path, name: str, requires: str = "[]") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Does {name} things.\nrequires: {requires}\n---\n"
        f"# {name}\nSteps.\n"
    )
    return d


def test_requirements_are_env_bin_tool_or_either() -> None:
    assert Requirement.parse("env:GH_TOKEN") == Requirement("env", "GH_TOKEN")
    assert Requirement.parse("bin:git") == Requirement("bin", "git")
    assert Requirement.parse("python3") == Requirement("tool_or_bin", "python3")
    on_path = {"git": "/usr/bin/git"}
    found = missing(
        ["exec", "git", "env:GH_TOKEN", "bin:nope", "tool:teleport", "env:HOME", "nope2"],
        tools={"exec", "read"}, environ={"HOME": "/h", "GH_TOKEN": ""}, which=on_path.get,
    )  # fmt: skip
    assert [(m.entry, m.reason) for m in found] == [
        ("env:GH_TOKEN", "the environment variable GH_TOKEN is not set"),
        ("bin:nope", "the program 'nope' is not on PATH"),
        ("tool:teleport", "this runtime has no tool 'teleport'"),
        ("nope2", "'nope2' is neither a tool of this runtime nor a program on PATH"),
    ]


def test_a_skill_missing_a_requirement_is_hidden_with_the_reason(tmp_path: Path) -> None:
    write_skill(tmp_path, "deploy", "[env:DEPLOY_TOKEN, exec]")
    write_skill(tmp_path, "notes", "[read]")
    lib = SkillLibrary.discover([tmp_path], environ={})
    assert lib.names() == ["notes"] and "deploy" not in lib
    (hidden,) = lib.hidden
    assert hidden.skill.name == "deploy"
    assert [m.reason for m in hidden.missing] == [
        "the environment variable DEPLOY_TOKEN is not set"
    ]
    assert "deploy" not in lib.catalogue()
    lib = SkillLibrary.discover([tmp_path], environ={"DEPLOY_TOKEN": "x"})
    assert lib.names() == ["deploy", "notes"] and lib.hidden == ()


def test_the_bundled_skills_are_usable_here_and_the_bundled_map_names_them() -> None:
    lib = SkillLibrary.discover([bundled_skills_dir()])
    assert lib.hidden == () and lib.problems == ()
    assert load_skillmap(BUNDLED).unknown_skills(set(lib.names())) == {}


def test_skill_map_errors_name_the_file_and_line() -> None:
    text = "version: 1\ntypes:\n  - name: debugging\n    description: x\n    skills: []\n"
    with pytest.raises(SkillMapError, match=r"^m\.yaml:5: types\.0\.skills"):
        parse_skillmap(text, "m.yaml")
    with pytest.raises(SkillMapError, match=r"^m\.yaml:3: duplicate key 'version'"):
        parse_skillmap("version: 1\ntypes: []\nversion: 1\n", "m.yaml")
    with pytest.raises(SkillMapError, match=r"^m\.yaml:2: types\.0\.colour: Extra inputs"):
        parse_skillmap(
            "types:\n  - {name: a, description: x, skills: [s], colour: red}\n", "m.yaml"
        )
    with pytest.raises(SkillMapError, match=r"task type names must be unique"):
        parse_skillmap(
            "types:\n  - {name: a, description: x, skills: [s]}\n"
            "  - {name: a, description: y, skills: [t]}\n", "m.yaml"
        )  # fmt: skip


def test_skills_for_a_task_come_from_its_type_first_then_by_meaning() -> None:
    lib = SkillLibrary.discover([bundled_skills_dir()])
    tool = SkillsForTaskTool(lib, load_skillmap(BUNDLED))
    typed = tool.task_type("my pytest run fails with a KeyError in the parser")
    assert typed is not None and typed[0] == "debugging"
    typed = tool.task_type("the api returns 500 since the deploy, what happened")
    assert typed is not None and typed[0] == "incident"
    ranked = tool.rank("my pytest run fails with a KeyError in the parser", 3)
    assert ranked[0].name == "python-debugging" and ranked[0].task_type == "debugging"
    assert len(ranked) == 3 and all(m.task_type is None for m in ranked[1:])
    assert len({m.name for m in ranked}) == 3
    # no type clears the threshold: similarity alone
    assert tool.task_type("bake a chocolate cake for twelve people") is None
    # a map naming a skill the library lacks leaves it out
    tool.skillmap = parse_skillmap(
        "threshold: -1\ntypes:\n  - {name: any, description: anything, skills: [gone, code-review]}\n"
    )
    assert [m.name for m in tool.rank("whatever", 1)] == ["code-review"]


def test_the_skills_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nanocrab.cli import app

    home = tmp_path / "home"
    user = home / ".nanocrab" / "skills"
    write_skill(user, "deploy", "[env:NANOCRAB_TEST_DEPLOY_TOKEN]")
    broken = user / "broken"
    broken.mkdir()
    (broken / "SKILL.md").write_text("---\nname: broken\n---\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("NANOCRAB_TEST_DEPLOY_TOKEN", raising=False)
    monkeypatch.delenv("NANOCRAB_SKILLMAP", raising=False)
    runner = CliRunner()

    listed = runner.invoke(app, ["skills", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "deploy" not in [r["name"] for r in json.loads(listed.output)]
    every = json.loads(runner.invoke(app, ["skills", "list", "--all", "--json"]).output)
    (deploy,) = [r for r in every if r["name"] == "deploy"]
    assert deploy["hidden"] == ["the environment variable NANOCRAB_TEST_DEPLOY_TOKEN is not set"]

    shown = runner.invoke(app, ["skills", "show", "deploy"])
    assert shown.exit_code == 0 and "missing" in shown.output and "# deploy" in shown.output

    checked = runner.invoke(app, ["skills", "check", "--json"])
    assert checked.exit_code == 1, "an invalid skill fails the check"
    report = json.loads(checked.output)
    assert report["hidden"] == {
        "deploy": ["the environment variable NANOCRAB_TEST_DEPLOY_TOKEN is not set"]
    }
    (invalid,) = report["invalid"]
    assert invalid["path"].endswith("broken/SKILL.md") and "description" in invalid["message"]

    bad_map = tmp_path / "map.yaml"
    bad_map.write_text("version: 1\ntypes:\n  - name: Bad\n    description: x\n    skills: [a]\n")
    monkeypatch.setenv("NANOCRAB_SKILLMAP", str(bad_map))
    (broken / "SKILL.md").unlink()
    broken.rmdir()
    monkeypatch.setenv("NANOCRAB_TEST_DEPLOY_TOKEN", "t")
    checked = runner.invoke(app, ["skills", "check"])
    assert checked.exit_code == 1
    assert f"{bad_map}:3: types.0.name" in checked.output.replace("\n", "")
    assert "hidden" not in checked.output
