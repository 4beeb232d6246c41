"""SkillLibrary: discovery and precedence, problems, lazy bodies, catalogue, resources."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nanocrab.skills import (
    SkillError,
    SkillLibrary,
    bundled_skills_dir,
    default_skill_dirs,
)


def make_skill(
    root: Path, name: str, *, description: str = "", body: str = "", dirname: str | None = None
) -> Path:
    skill_dir = root / (dirname or name)
    skill_dir.mkdir(parents=True)
    description = description or f"The {name} skill. Use when testing {name}."
    body = body or f"# {name}\n\nInstructions for {name}.\n"
    (skill_dir / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n\n{body}", encoding="utf-8"
    )
    return skill_dir


def skill_error(call: Callable[..., object], *args: object) -> SkillError:
    with pytest.raises(SkillError) as caught:
        call(*args)
    return caught.value


def test_later_directories_override_earlier_ones_by_name(tmp_path: Path) -> None:
    bundled, workspace = tmp_path / "bundled", tmp_path / "workspace"
    make_skill(bundled, "alpha", description="Bundled alpha.")
    make_skill(bundled, "beta", description="Bundled beta.")
    make_skill(workspace, "alpha", description="Workspace alpha.")

    library = SkillLibrary.discover([bundled, workspace])

    assert library.names() == ["alpha", "beta"]
    alpha, beta = library.get("alpha"), library.get("beta")
    assert alpha is not None and beta is not None
    assert alpha.description == "Workspace alpha."
    assert alpha.root == (workspace / "alpha").resolve()
    assert beta.description == "Bundled beta."
    assert library.problems == ()


def test_precedence_follows_the_order_given_not_the_paths(tmp_path: Path) -> None:
    bundled, workspace = tmp_path / "bundled", tmp_path / "workspace"
    make_skill(bundled, "alpha", description="Bundled alpha.")
    make_skill(workspace, "alpha", description="Workspace alpha.")

    library = SkillLibrary.discover([workspace, bundled])

    alpha = library.get("alpha")
    assert alpha is not None
    assert alpha.description == "Bundled alpha."


def test_workspace_skills_override_bundled_ones_through_the_default_dirs(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    make_skill(workspace / "skills", "code-review", description="Our house review rules.")
    make_skill(workspace / ".nanocrab" / "skills", "house-style", description="House style.")

    library = SkillLibrary.discover(default_skill_dirs(workspace=workspace, user_dir=None))

    review = library.get("code-review")
    assert review is not None
    assert review.description == "Our house review rules."
    assert "house-style" in library
    assert "python-debugging" in library


def test_invalid_skills_are_reported_and_valid_ones_still_load(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "good")
    make_skill(root, "mismatch", dirname="renamed")
    broken = root / "broken"
    broken.mkdir()
    (broken / "SKILL.md").write_text("no frontmatter here\n", encoding="utf-8")
    nodesc = root / "nodesc"
    nodesc.mkdir()
    (nodesc / "SKILL.md").write_text("---\nname: nodesc\n---\nbody\n", encoding="utf-8")

    library = SkillLibrary.discover([root])

    assert library.names() == ["good"]
    problems = {problem.path: problem.message for problem in library.problems}
    assert set(problems) == {
        broken / "SKILL.md",
        nodesc / "SKILL.md",
        root / "renamed" / "SKILL.md",
    }
    assert "no YAML frontmatter" in problems[broken / "SKILL.md"]
    assert "description: missing" in problems[nodesc / "SKILL.md"]
    assert "does not match the directory name" in problems[root / "renamed" / "SKILL.md"]


def test_an_invalid_override_keeps_the_earlier_skill(tmp_path: Path) -> None:
    bundled, workspace = tmp_path / "bundled", tmp_path / "workspace"
    make_skill(bundled, "alpha", description="Bundled alpha.")
    bad = workspace / "alpha"
    bad.mkdir(parents=True)
    (bad / "SKILL.md").write_text("---\nname: alpha\n---\n", encoding="utf-8")

    library = SkillLibrary.discover([bundled, workspace])

    alpha = library.get("alpha")
    assert alpha is not None and alpha.description == "Bundled alpha."
    assert [problem.path for problem in library.problems] == [bad / "SKILL.md"]


def test_missing_dirs_hidden_dirs_and_plain_dirs_are_ignored(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "good")
    make_skill(root, "hidden", dirname=".hidden")
    (root / "notes").mkdir()
    (root / "notes" / "README.md").write_text("not a skill", encoding="utf-8")
    (root / "loose-file.md").write_text("not a skill", encoding="utf-8")

    library = SkillLibrary.discover([tmp_path / "missing", root])

    assert library.names() == ["good"]
    assert library.problems == ()
    assert len(library) == 1


def test_the_body_is_read_lazily_then_cached(tmp_path: Path) -> None:
    skill_dir = make_skill(tmp_path, "alpha", body="Original body.\n")
    library = SkillLibrary.discover([tmp_path])
    skill_md = skill_dir / "SKILL.md"
    text = skill_md.read_text(encoding="utf-8")

    skill_md.write_text(text.replace("Original body.", "Edited before first use."), "utf-8")
    assert library.body("alpha") == "Edited before first use."

    skill_md.write_text(text.replace("Original body.", "Edited after first use."), "utf-8")
    assert library.body("alpha") == "Edited before first use."
    assert SkillLibrary.discover([tmp_path]).body("alpha") == "Edited after first use."


def test_a_skill_broken_after_discovery_fails_when_its_body_is_read(tmp_path: Path) -> None:
    skill_dir = make_skill(tmp_path, "alpha")
    library = SkillLibrary.discover([tmp_path])
    (skill_dir / "SKILL.md").write_text("---\nname: alpha\n", encoding="utf-8")

    error = skill_error(library.body, "alpha")

    assert error.kind == "invalid_skill"
    assert "not closed" in error.message


def test_unknown_skills_are_not_found_with_the_available_names(tmp_path: Path) -> None:
    make_skill(tmp_path, "alpha")
    make_skill(tmp_path, "beta")
    library = SkillLibrary.discover([tmp_path])

    for call, args in [
        (library.body, ("gamma",)),
        (library.resources, ("gamma",)),
        (library.resource, ("gamma", "x.md")),
    ]:
        error = skill_error(call, *args)
        assert error.kind == "not_found"
        assert "'gamma'" in error.message
        assert "alpha, beta" in error.message
    assert library.get("gamma") is None


def test_the_catalogue_is_metadata_only(tmp_path: Path) -> None:
    make_skill(tmp_path, "beta", description="Beta does b. Use when b.", body="SECRET-BODY-B\n")
    make_skill(tmp_path, "alpha", description="Alpha does a. Use when a.", body="SECRET-BODY-A\n")
    (tmp_path / "alpha" / "references").mkdir()
    (tmp_path / "alpha" / "references" / "ref.md").write_text("SECRET-REF", encoding="utf-8")
    library = SkillLibrary.discover([tmp_path])

    catalogue = library.catalogue()

    assert catalogue == "- alpha: Alpha does a. Use when a.\n- beta: Beta does b. Use when b."
    assert "SECRET" not in catalogue


def test_the_catalogue_can_be_limited_to_chosen_skills_in_order(tmp_path: Path) -> None:
    for name in ["alpha", "beta", "gamma"]:
        make_skill(tmp_path, name, description=f"{name.title()} skill.")
    library = SkillLibrary.discover([tmp_path])

    assert library.catalogue(["gamma", "alpha", "gamma"]) == (
        "- gamma: Gamma skill.\n- alpha: Alpha skill."
    )
    assert library.catalogue([]) == ""
    error = skill_error(library.catalogue, ["alpha", "nope"])
    assert error.kind == "not_found"
    assert "nope" in error.message


def test_the_catalogue_folds_multiline_descriptions(tmp_path: Path) -> None:
    skill_dir = tmp_path / "alpha"
    skill_dir.mkdir()
    (skill_dir / "SKILL.md").write_text(
        "---\nname: alpha\ndescription: |\n  Line one.\n  Line two.\n---\nbody\n", "utf-8"
    )

    library = SkillLibrary.discover([tmp_path])

    assert library.catalogue() == "- alpha: Line one. Line two."


@pytest.fixture
def skill_with_resources(tmp_path: Path) -> tuple[SkillLibrary, Path, Path]:
    """A skill with resources, a secret file beside the skills dir, and symlinks in and out."""
    skills = tmp_path / "skills"
    skill_dir = make_skill(skills, "alpha")
    for relpath, text in {
        "scripts/run.py": "print('hi')\n",
        "references/guide.md": "# Guide\n",
        "references/deep/more.md": "more\n",
        "assets/logo.bin": "logo",
        "notes.md": "top-level extra\n",
        "references/.hidden.md": "hidden\n",
        "scripts/__pycache__/run.cpython-311.pyc": "cache",
    }.items():
        path = skill_dir / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET", encoding="utf-8")
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "inner.txt").write_text("ALSO SECRET", encoding="utf-8")
    os.symlink(secret, skill_dir / "references" / "link-out.md")
    os.symlink(outside_dir, skill_dir / "linked-dir")
    os.symlink(skill_dir / "references" / "guide.md", skill_dir / "assets" / "guide-link.md")
    return SkillLibrary.discover([skills]), skill_dir, secret


def test_resources_lists_files_beside_skill_md(
    skill_with_resources: tuple[SkillLibrary, Path, Path],
) -> None:
    library, _, _ = skill_with_resources

    assert library.resources("alpha") == [
        "assets/guide-link.md",
        "assets/logo.bin",
        "notes.md",
        "references/deep/more.md",
        "references/guide.md",
        "scripts/run.py",
    ]


def test_a_resource_is_read_as_bytes(
    skill_with_resources: tuple[SkillLibrary, Path, Path],
) -> None:
    library, _, _ = skill_with_resources

    assert library.resource("alpha", "references/guide.md") == b"# Guide\n"
    assert library.resource("alpha", "references/deep/../guide.md") == b"# Guide\n"
    assert library.resource("alpha", "assets/guide-link.md") == b"# Guide\n"


@pytest.mark.parametrize(
    "relpath",
    [
        "../../secret.txt",
        "references/../../../secret.txt",
        "references/link-out.md",
        "linked-dir/inner.txt",
        "SECRET_ABSOLUTE",
    ],
)
def test_resource_paths_cannot_leave_the_skill(
    skill_with_resources: tuple[SkillLibrary, Path, Path], relpath: str
) -> None:
    library, _, secret = skill_with_resources
    if relpath == "SECRET_ABSOLUTE":
        relpath = str(secret)

    error = skill_error(library.resource, "alpha", relpath)

    assert error.kind == "path_escape"
    assert repr(relpath) in error.message


@pytest.mark.parametrize("relpath", ["missing.md", "references", "", "."])
def test_missing_resources_and_directories_are_not_found(
    skill_with_resources: tuple[SkillLibrary, Path, Path], relpath: str
) -> None:
    library, _, _ = skill_with_resources

    error = skill_error(library.resource, "alpha", relpath)

    assert error.kind == "not_found"


def test_default_dirs_are_bundled_user_then_workspace_and_skip_missing(tmp_path: Path) -> None:
    user = tmp_path / "user-skills"
    workspace = tmp_path / "ws"
    (workspace / ".nanocrab" / "skills").mkdir(parents=True)
    (workspace / "skills").mkdir()

    assert default_skill_dirs(workspace=workspace, user_dir=user) == [
        bundled_skills_dir(),
        workspace / ".nanocrab" / "skills",
        workspace / "skills",
    ]
    user.mkdir()
    assert default_skill_dirs(workspace=workspace, user_dir=user) == [
        bundled_skills_dir(),
        user,
        workspace / ".nanocrab" / "skills",
        workspace / "skills",
    ]
    assert default_skill_dirs(workspace=None, user_dir=None) == [bundled_skills_dir()]


def test_a_directory_reached_twice_is_listed_once(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.symlink(bundled_skills_dir(), workspace / "skills")

    assert default_skill_dirs(workspace=workspace, user_dir=None) == [bundled_skills_dir()]


def test_the_bundled_dir_is_the_repositorys_top_level_skills() -> None:
    bundled = bundled_skills_dir()

    assert bundled == Path(__file__).resolve().parents[1] / "skills"
    assert bundled.is_dir()
