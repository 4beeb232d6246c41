"""SKILL.md parsing and validation: what loads, and what each mistake's message says."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanocrab.skills import SkillError, load_skill, parse_skill_text, read_body


def write_skill_md(root: Path, dirname: str, text: str | bytes) -> Path:
    skill_dir = root / dirname
    skill_dir.mkdir(parents=True)
    file = skill_dir / "SKILL.md"
    if isinstance(text, bytes):
        file.write_bytes(text)
    else:
        file.write_text(text, encoding="utf-8")
    return skill_dir


def load_error(tmp_path: Path, text: str, dirname: str = "demo") -> SkillError:
    skill_dir = write_skill_md(tmp_path, dirname, text)
    with pytest.raises(SkillError) as caught:
        load_skill(skill_dir)
    assert caught.value.kind == "invalid_skill"
    assert str(skill_dir / "SKILL.md") in caught.value.message
    assert caught.value.path == skill_dir / "SKILL.md"
    return caught.value


def test_a_valid_skill_loads_with_all_fields(tmp_path: Path) -> None:
    skill_dir = write_skill_md(
        tmp_path,
        "demo",
        "---\n"
        "name: demo\n"
        "description: Does the demo. Use when demonstrating.\n"
        "requires: [exec, git]\n"
        "license: MIT\n"
        'version: "1.10"\n'
        "metadata: {author: someone}\n"
        "---\n\n# Demo\n\nStep one.\n\n",
    )

    skill = load_skill(skill_dir)

    assert skill.name == "demo"
    assert skill.description == "Does the demo. Use when demonstrating."
    assert skill.meta.requires == ("exec", "git")
    assert skill.meta.license == "MIT"
    assert skill.meta.version == "1.10"
    assert skill.meta.metadata == {"author": "someone"}
    assert skill.root == skill_dir.resolve()
    assert read_body(skill) == "# Demo\n\nStep one."


def test_crlf_line_endings_and_a_bom_are_accepted(tmp_path: Path) -> None:
    text = "---\r\nname: demo\r\ndescription: Demo skill.\r\n---\r\nBody line\r\n"
    skill_dir = write_skill_md(tmp_path, "demo", b"\xef\xbb\xbf" + text.encode())

    skill = load_skill(skill_dir)

    assert skill.description == "Demo skill."
    assert read_body(skill) == "Body line"


def test_a_single_requirement_string_becomes_a_list(tmp_path: Path) -> None:
    meta, _ = parse_skill_text(
        "---\nname: demo\ndescription: d\nrequires: python3\n---\n", file=tmp_path / "SKILL.md"
    )
    assert meta.requires == ("python3",)


def test_a_multiline_description_is_kept_and_stripped(tmp_path: Path) -> None:
    meta, body = parse_skill_text(
        "---\nname: demo\ndescription: >-\n  First line\n  second line.\n---\n",
        file=tmp_path / "SKILL.md",
    )
    assert meta.description == "First line second line."
    assert body == ""


def test_missing_frontmatter_says_how_the_file_must_start(tmp_path: Path) -> None:
    error = load_error(tmp_path, "# Demo\n\nname: demo\n")
    assert "no YAML frontmatter" in error.message
    assert "'---'" in error.message


def test_frontmatter_must_start_on_the_first_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "\n---\nname: demo\ndescription: d\n---\n")
    assert "no YAML frontmatter" in error.message


def test_unclosed_frontmatter_is_reported(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: demo\ndescription: d\n# Body without a closing line\n")
    assert "not closed" in error.message


def test_oversized_frontmatter_is_rejected(tmp_path: Path) -> None:
    error = load_error(tmp_path, f"---\nname: demo\ndescription: {'x' * 70_000}\n---\n")
    assert "longer than 64 KiB" in error.message


def test_bad_yaml_names_the_line_and_suggests_quoting(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: demo\ndescription: Use when: things break\n---\n")
    assert "invalid YAML" in error.message
    assert "line 3" in error.message
    assert "quote" in error.message


def test_frontmatter_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\n- name\n- description\n---\n")
    assert "must be a YAML mapping" in error.message


def test_empty_frontmatter_is_rejected(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\n---\nbody\n")
    assert "must be a YAML mapping" in error.message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Demo", "not a valid skill name"),
        ("demo_skill", "not a valid skill name"),
        ("-demo", "not a valid skill name"),
        ("demo-", "not a valid skill name"),
        ("de--mo", "not a valid skill name"),
        ("démo", "not a valid skill name"),
        ("a" * 65, "the limit is 64"),
        ("123", "must be a string"),
    ],
)
def test_invalid_names_are_rejected_with_the_rule(tmp_path: Path, name: str, expected: str) -> None:
    error = load_error(tmp_path, f"---\nname: {name}\ndescription: d\n---\n")
    assert "name:" in error.message
    assert expected in error.message


def test_the_longest_valid_name_is_accepted(tmp_path: Path) -> None:
    name = "a" * 64
    skill = load_skill(write_skill_md(tmp_path, name, f"---\nname: {name}\ndescription: d\n---\n"))
    assert skill.name == name


def test_name_must_equal_the_directory_name(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: other\ndescription: d\n---\n", dirname="demo")
    assert "'other' does not match the directory name 'demo'" in error.message


def test_missing_name_says_to_use_the_directory_name(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\ndescription: d\n---\n")
    assert "name: missing" in error.message


def test_missing_description_says_what_to_write(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: demo\n---\nbody\n")
    assert "description: missing" in error.message
    assert "when to use it" in error.message


@pytest.mark.parametrize("value", ['""', '"   "', "null", "[a, b]"])
def test_an_empty_or_non_text_description_is_rejected(tmp_path: Path, value: str) -> None:
    error = load_error(tmp_path, f"---\nname: demo\ndescription: {value}\n---\n")
    assert "description: must be a non-empty string" in error.message


def test_an_overlong_description_is_rejected(tmp_path: Path) -> None:
    error = load_error(tmp_path, f"---\nname: demo\ndescription: {'x' * 1025}\n---\n")
    assert "description: is 1025 characters long; the limit is 1024" in error.message


def test_unknown_keys_are_rejected_with_the_accepted_ones(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: demo\ndescription: d\nrequire: [git]\n---\n")
    assert "require: unknown key" in error.message
    assert "requires" in error.message


def test_an_unquoted_numeric_version_asks_for_quotes(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: demo\ndescription: d\nversion: 1.10\n---\n")
    assert 'version: must be a string; quote it in YAML, e.g. version: "1.1"' in error.message


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    error = load_error(tmp_path, "---\nname: Bad_Name\nextra: 1\n---\n")
    assert "name:" in error.message
    assert "description: missing" in error.message
    assert "extra: unknown key" in error.message


def test_discovery_reads_only_the_frontmatter(tmp_path: Path) -> None:
    head = b"---\nname: demo\ndescription: d\n---\n"
    skill_dir = write_skill_md(tmp_path, "demo", head + b"body \xff\xfe not utf-8\n")

    skill = load_skill(skill_dir)

    with pytest.raises(SkillError) as caught:
        read_body(skill)
    assert caught.value.kind == "invalid_skill"
    assert "not UTF-8" in caught.value.message


def test_a_directory_without_skill_md_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    with pytest.raises(SkillError) as caught:
        load_skill(tmp_path / "demo")
    assert caught.value.kind == "not_found"
    assert "SKILL.md" in caught.value.message
