"""Reading a configuration file as plain YAML data: what policy.yaml and guardrails.yaml share.

Both are loaded with ``yaml.compose`` (safe-load semantics: tags such as ``!!python/object`` are
refused) and refuse duplicate keys, which YAML would silently resolve to the last one. These
helpers only *describe* a problem with the file and line; each loader raises its own error type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def yaml_problem(exc: yaml.YAMLError, source: str, what: str) -> str:
    """``source:line: problem`` for a YAML error; ``what`` names the file kind in the message
    about refused tags (``"policy files"``, ``"guardrails files"``)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in problem:
        return (
            f"{where}: {problem}; {what} are plain YAML data: tags are refused "
            "(such as !!python/object)"
        )
    return f"{where}: not valid YAML: {problem}"


def duplicate_key(node: yaml.Node, source: str) -> str | None:
    """``source:line: duplicate key 'k'; ...`` for the first mapping key that repeats anywhere
    in the document, or ``None``."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[object] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        return (
                            f"{source}:{key.start_mark.line + 1}: duplicate key {key.value!r}; "
                            "YAML would silently keep only the last one"
                        )
                    seen.add(key.value)
                stack.extend((key, value))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return None


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (a pydantic error location: keys and list
    indices), or of its closest existing ancestor; ``None`` without a document."""
    if node is None:
        return None
    current = node
    for step in loc:
        child: yaml.Node | None = None
        if isinstance(current, yaml.MappingNode):
            child = next((v for k, v in current.value if getattr(k, "value", None) == step), None)
        elif isinstance(current, yaml.SequenceNode) and isinstance(step, int):
            child = current.value[step] if step < len(current.value) else None
        if child is None:
            break
        current = child
    return current.start_mark.line + 1


_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (its wheels are): the same documents, nodes
and marks as the pure-Python one, parsed ~10 times faster (the bundled policy and guardrails
files are read at every command's start)."""


def read_config_text(path: Path, error: type[Exception]) -> str:
    """The text of configuration file ``path``; ``error("path: cannot read: ...")`` when it
    cannot be read or is not UTF-8."""
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from exc


def read_yaml(
    text: str, source: str, error: type[Exception], *, what: str, empty: str | None = None
) -> tuple[Any, yaml.Node | None]:
    """``text`` as plain YAML data and its node (for :func:`line_of`); tags, several documents
    and duplicate keys raise ``error("source:line: ...")``. ``what`` names the file kind in the
    message about refused tags (``"policy files"``); with ``empty``, an empty file raises
    ``error(f"{source}: {empty}")`` instead of reading as ``None``."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            if empty is not None:
                raise error(f"{source}: {empty}")
            return None, None
        if (duplicate := duplicate_key(node, source)) is not None:
            raise error(duplicate)
        return loader.construct_document(node), node
    except yaml.YAMLError as exc:
        raise error(yaml_problem(exc, source, what)) from exc
    finally:
        loader.dispose()


def parse_model(
    text: str, source: str, model: type[M], error: type[Exception], *, what: str, shape: str
) -> M:
    """``text`` read as plain YAML data (no tags, no duplicate keys) and validated as ``model``;
    every problem raises ``error("source:line: ...")``. ``what`` names the file kind in the
    message about refused tags (``"agents files"``); ``shape`` says what the top level must be
    (``"agents.yaml is a mapping with 'version: 1' and 'agents'"``)."""
    data, node = read_yaml(text, source, error, what=what)
    if not isinstance(data, dict):
        raise error(f"{source}:1: {shape}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        line = line_of(node, loc)
        where = f"{source}:{line}" if line else source
        path = ".".join(str(p) for p in loc) or source.rsplit("/", 1)[-1].strip("<>")
        raise error(f"{where}: {path}: {err['msg']}") from exc
