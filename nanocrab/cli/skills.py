"""``nanocrab skills list|show|check``: the skills the agent gets, and why others are left out.

Registers the ``skills`` sub-app on import. Imports only typer and the CLI's console at module
level; the skills package loads when a command runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err

if TYPE_CHECKING:
    from nanocrab.cli.settings import Settings
    from nanocrab.skills import SkillLibrary

skills_app = typer.Typer(
    help="Skills: list them, show one, check the skill directories and the skill map.",
    no_args_is_help=True,
)
app.add_typer(skills_app, name="skills")


def _library() -> tuple[SkillLibrary, list[Path], Settings]:
    """The skills as the runtime discovers them (bundled, then the user's directory)."""
    from nanocrab.cli.common import settings_or_exit
    from nanocrab.skills import SkillLibrary, default_skill_dirs

    settings = settings_or_exit()
    dirs = default_skill_dirs(workspace=None, user_dir=settings.user_skills)
    return SkillLibrary.discover(dirs), dirs, settings


def _one_line(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@skills_app.command("list")
def list_skills(
    all_: Annotated[
        bool, typer.Option("--all", help="Also the skills hidden for a missing requirement.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The skills the agent can load (name, what for, where from)."""
    library, _, _ = _library()
    rows = [
        {"name": n, "description": s.description, "path": str(s.root), "hidden": []}
        for n in library.names()
        if (s := library.get(n)) is not None
    ]
    if all_:
        rows += [
            {"name": h.skill.name, "description": h.skill.description, "path": str(h.skill.root),
             "hidden": [m.reason for m in h.missing]}
            for h in library.hidden
        ]  # fmt: skip
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        console.print("no skills found (bundled skills/ and ~/.nanocrab/skills)")
    for row in rows:
        hidden = row["hidden"]
        mark = f" [yellow](hidden: {'; '.join(hidden)})[/]" if hidden else ""
        console.print(f"[bold]{row['name']}[/]{mark}  {_one_line(str(row['description']))}",
                      soft_wrap=True)  # fmt: skip
    if not all_ and library.hidden:
        console.print(f"[dim]{len(library.hidden)} hidden for a missing requirement: "
                      "`nanocrab skills check`[/]")  # fmt: skip


@skills_app.command("show")
def show_skill(
    name: Annotated[str, typer.Argument(help="The skill's name.")],
    as_json: JsonOpt = False,
) -> None:
    """A skill's metadata, requirements, resources and instructions."""
    from nanocrab.skills import SkillError, SkillLibrary
    from nanocrab.skills.requires import missing

    library, _, _ = _library()
    hidden = {h.skill.name: h for h in library.hidden}
    skill = library.get(name) or (hidden[name].skill if name in hidden else None)
    if skill is None:
        err.print(f"no skill {name!r}; available: {', '.join(library.names()) or '(none)'}")
        raise typer.Exit(1)
    lacking = {m.entry: m.reason for m in missing(skill.meta.requires)}
    solo = SkillLibrary([skill])  # reads the body and resources of a hidden skill too
    try:
        body, resources = solo.body(name), solo.resources(name)
    except SkillError as exc:
        err.print(f"[bold red]skill error:[/] {exc.message}", soft_wrap=True)
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps({
            "name": skill.name, "description": skill.description, "path": str(skill.root),
            "version": skill.meta.version, "requires": list(skill.meta.requires),
            "missing": lacking, "hidden": name in hidden, "resources": resources, "body": body,
        }))  # fmt: skip
        return
    console.print(f"[bold]{skill.name}[/] {skill.meta.version or ''}  ({skill.root})")
    console.print(_one_line(skill.description, 400), soft_wrap=True)
    for entry in skill.meta.requires:
        state = f"[red]missing[/]: {lacking[entry]}" if entry in lacking else "[green]ok[/]"
        console.print(f"  requires {entry}: {state}")
    if resources:
        console.print("  resources: " + ", ".join(resources))
    console.print()
    console.print(body, markup=False, highlight=False)


@skills_app.command("check")
def check_skills(as_json: JsonOpt = False) -> None:
    """Check the skill directories and the skill map: invalid skills (file and what to fix),
    skills hidden for a missing requirement (and why), map errors (file:line) and map entries
    naming no usable skill. Exit status 1 when a skill or the map is invalid."""
    from nanocrab.skills.taskmap import SkillMapError, load_skillmap, skillmap_file

    library, dirs, settings = _library()
    map_path = skillmap_file(settings.home, os.environ)
    map_error: str | None = None
    unknown: dict[str, list[str]] = {}
    try:
        unknown = load_skillmap(map_path).unknown_skills(set(library.names()))
    except SkillMapError as exc:
        map_error = str(exc)
    report = {
        "dirs": [str(d) for d in dirs],
        "usable": library.names(),
        "invalid": [{"path": str(p.path), "message": p.message} for p in library.problems],
        "hidden": {h.skill.name: [m.reason for m in h.missing] for h in library.hidden},
        "skillmap": str(map_path),
        "skillmap_error": map_error,
        "skillmap_unusable": unknown,
    }
    failed = bool(library.problems) or map_error is not None
    if as_json:
        print(json.dumps(report))
        raise typer.Exit(1 if failed else 0)
    console.print(f"skill directories: {', '.join(report['dirs']) or '(none)'}")  # type: ignore[arg-type]
    console.print(f"[green]{len(library)} usable[/]: {', '.join(library.names()) or '-'}")
    for p in library.problems:
        console.print(f"[bold red]invalid[/] {p.message}", soft_wrap=True)
    for h in library.hidden:
        why = "; ".join(m.reason for m in h.missing)
        console.print(f"[yellow]hidden[/] {h.skill.name}: {why}", soft_wrap=True)
    if map_error is not None:
        console.print(f"[bold red]skill map error[/] {map_error}", soft_wrap=True)
    else:
        console.print(f"skill map: {map_path}")
        for ttype, names in unknown.items():
            console.print(f"[yellow]skill map[/] type {ttype}: no usable skill "
                          f"{', '.join(names)} (left out of answers)")  # fmt: skip
    raise typer.Exit(1 if failed else 0)
