"""guardrails.yaml: validation errors name the file and line; the bundled chain loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanocrab.guardrails import GuardrailsConfig, GuardrailsError, load_guardrails


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "guardrails.yaml"
    path.write_text(text, "utf-8")
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(GuardrailsError) as info:
        load_guardrails(path)
    return str(info.value)


def test_bundled_default_loads_and_watches_every_checkpoint() -> None:
    chain = load_guardrails()
    assert chain.source.endswith("default.yaml (bundled)")
    ids = [f.id for f in chain.filters]
    assert len(ids) == len(set(ids))
    for checkpoint in ("task_input", "tool_output", "tool_call", "reply"):
        assert chain.has_filter_for(checkpoint)


def test_unknown_key_names_file_line_and_filter(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: pii
    checkpoints: [task_input]
    detector: pii
    action: redact
    entitees: [email]
""")
    assert f"{tmp_path / 'guardrails.yaml'}:7:" in message
    assert "filter 'pii' (#1)" in message
    assert "entitees: unknown key" in message
    assert "entities" in message  # the allowed keys for this detector are listed


def test_unknown_detector_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: x
    checkpoints: [reply]
    detector: magic
    action: block
""")
    assert ":3:" in message and "'detector' must be one of" in message


def test_bad_action_and_threshold_point_at_their_lines(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: a
    checkpoints: [reply]
    detector: secrets
    action: explode
  - id: b
    checkpoints: [reply]
    detector: secrets
    threshold: 1.5
    action: redact
""")
    assert ":6: filter 'a' (#1): action:" in message and "'explode'" in message
    assert ":10: filter 'b' (#2): threshold:" in message


def test_bad_checkpoint_and_bad_regex(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: deny
    checkpoints: [tool_result]
    detector: deny_list
    regexes: ["(unclosed"]
    action: block
""")
    assert ":4:" in message and "tool_result" in message
    assert ":6:" in message and "does not compile" in message


def test_scope_rules(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: t
    checkpoints: [task_input]
    tools: [web_fetch]
    detector: injection
    action: block
""")
    assert "'tools' scopes tool_output and tool_call" in message
    message = _error(tmp_path, """version: 1
filters:
  - id: align
    checkpoints: [tool_output]
    detector: alignment
    action: require_approval
""")
    assert "checkpoints: [tool_call]" in message
    message = _error(tmp_path, """version: 1
filters:
  - id: empty
    checkpoints: [reply]
    detector: deny_list
    action: block
""")
    assert "needs keywords, regexes, topics or domains" in message


def test_duplicates_tags_and_shapes(tmp_path: Path) -> None:
    message = _error(tmp_path, """version: 1
filters:
  - id: a
    checkpoints: [reply]
    checkpoints: [task_input]
    detector: secrets
    action: redact
""")
    assert ":5: duplicate key 'checkpoints'" in message
    message = _error(tmp_path, """version: 1
filters:
  - {id: a, checkpoints: [reply], detector: secrets, action: redact}
  - {id: a, checkpoints: [reply], detector: secrets, action: redact}
""")
    assert "duplicate filter id 'a'" in message
    message = _error(tmp_path, "version: 1\nfilters: !!python/object/apply:os.system [ls]\n")
    assert ":2:" in message and "tags are refused" in message
    assert "empty" in _error(tmp_path, "")
    assert "is a mapping" in _error(tmp_path, "- 1\n- 2\n")
    assert ":3: not valid YAML" in _error(tmp_path, "version: 1\nfilters: [\n")


def test_from_mapping_reports_the_source() -> None:
    with pytest.raises(GuardrailsError, match="<test>: version"):
        GuardrailsConfig.from_mapping({"version": 2}, "<test>")
    chain = GuardrailsConfig.from_mapping({"version": 1, "filters": []})
    assert chain.filters == () and not chain.has_filter_for("reply")
