"""Workspace confinement: resolve_in_workspace and every file tool refusing paths that escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nanocrab.tools import ToolError, ToolRegistry, default_tools, resolve_in_workspace
from tests.test_tools_support import make_ctx


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("top secret\n")
    return out


def escape(ws: Path, path: str) -> ToolError:
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(ws, path)
    assert info.value.kind == "path_escape"
    return info.value


def test_relative_paths_join_the_workspace(ws: Path) -> None:
    assert resolve_in_workspace(ws, "a/b.txt") == ws / "a" / "b.txt"
    assert resolve_in_workspace(ws, ".") == ws
    assert resolve_in_workspace(ws, "a/../b") == ws / "b"


def test_absolute_path_inside_is_accepted(ws: Path) -> None:
    assert resolve_in_workspace(ws, str(ws / "x.txt")) == ws / "x.txt"


def test_dotdot_escape_is_denied_naming_path_and_workspace(ws: Path) -> None:
    err = escape(ws, "../outside/secret.txt")
    assert "../outside/secret.txt" in err.message
    assert str(ws) in err.message


def test_absolute_path_outside_is_denied(ws: Path, outside: Path) -> None:
    escape(ws, str(outside / "secret.txt"))
    escape(ws, "/etc/passwd")


def test_sibling_with_common_prefix_is_outside(tmp_path: Path, ws: Path) -> None:
    sibling = tmp_path / "ws-evil"
    sibling.mkdir()
    escape(ws, str(sibling / "x"))
    escape(ws, "../ws-evil/x")


def test_symlinks_are_resolved_before_the_check(ws: Path, outside: Path) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "linkdir").symlink_to(outside)
    (ws / "dangling").symlink_to(outside / "not-yet.txt")
    escape(ws, "link.txt")
    escape(ws, "linkdir/secret.txt")
    escape(ws, "linkdir/new/file.txt")
    escape(ws, "dangling")


def test_symlink_inside_the_workspace_is_fine(ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "alias").symlink_to(ws / "real")
    assert resolve_in_workspace(ws, "alias/f.txt") == ws / "real" / "f.txt"


def test_workspace_given_through_a_symlink(tmp_path: Path, ws: Path) -> None:
    (tmp_path / "ws-link").symlink_to(ws)
    assert resolve_in_workspace(tmp_path / "ws-link", "f.txt") == ws / "f.txt"
    escape(tmp_path / "ws-link", "../outside")


@pytest.mark.parametrize("path", ["", "   ", "a\x00b"])
def test_empty_and_nul_paths_are_invalid(ws: Path, path: str) -> None:
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(ws, path)
    assert info.value.kind == "invalid_arguments"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read", {"path": "../outside/secret.txt"}),
        ("read", {"path": "link.txt"}),
        ("read", {"path": "linkdir/secret.txt"}),
        ("edit", {"path": "link.txt", "old_text": "top", "new_text": "no"}),
        ("ls", {"path": "linkdir"}),
        ("ls", {"path": ".."}),
        ("grep", {"pattern": "secret", "path": "linkdir"}),
        ("glob", {"pattern": "*", "path": ".."}),
    ],
)
async def test_tools_refuse_escaping_paths(
    ws: Path, outside: Path, tool: str, arguments: dict[str, str]
) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "linkdir").symlink_to(outside)
    result = await ToolRegistry(default_tools()).invoke(tool, arguments, make_ctx(ws))
    assert result.error_kind == "path_escape", result
    assert "top secret" not in str(result.content)
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.parametrize(
    "path", ["link.txt", "dangling.txt", "linkdir/new.txt", "linkdir/deep/new.txt", "../x.txt"]
)
async def test_write_never_lands_outside(ws: Path, outside: Path, path: str) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "dangling.txt").symlink_to(outside / "created-by-write.txt")
    (ws / "linkdir").symlink_to(outside)
    before = sorted(os.listdir(outside))
    result = await ToolRegistry(default_tools()).invoke(
        "write", {"path": path, "content": "pwned"}, make_ctx(ws)
    )
    assert result.error_kind == "path_escape", result
    assert sorted(os.listdir(outside)) == before
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert not (ws.parent / "x.txt").exists()
