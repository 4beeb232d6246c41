"""Host file tools on a tree that changes under them: a symlink swapped in after the tool checked
the path (by a concurrent process or a parallel call) is never followed out of the workspace.

Three kinds of test: a hook planting the link right after ``resolve_in_workspace`` (which
the local backend's ``resolve`` calls for every tool) returned, for
every file tool (deterministic); the same hook planting links that stay inside, which still work;
and a race harness where a thread swaps a directory and a file for links to an outside secret in
a tight loop while the tools run many times. The outside tree must never reach a result and
must never change.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nanocrab.tools import (
    LocalOperations,
    ToolContext,
    ToolRegistry,
    ToolResult,
    default_tools,
    paths,
)
from nanocrab.tools import ops as ops_module
from nanocrab.tools.paths import PathEscape
from tests.test_tools_support import make_ctx

SECRET = "OUTSIDE-SECRET-c0ffee"
OUTSIDE_ONLY = "outside-only-entry.txt"
INSIDE = "inside text alpha"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A tree next to the workspace holding the secret, the way an attacker's target looks:
    the same names as the workspace's, so a followed link would succeed quietly."""
    root = tmp_path / "outside"
    root.mkdir()
    (root / "secret.txt").write_text(f"{SECRET} alpha\n")
    (root / "doc.txt").write_text(f"{SECRET} alpha\n")
    (root / OUTSIDE_ONLY).write_text(f"{SECRET}\n")
    return root


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "doc.txt").write_text(f"{INSIDE}\n")
    (ws / "sub" / "doc.txt").write_text(f"{INSIDE}\n")
    (ws / "elsewhere").mkdir()
    (ws / "elsewhere" / "doc.txt").write_text("elsewhere alpha\n")
    (ws / "elsewhere" / "real.txt").write_text("real alpha\n")
    return make_ctx(ws)


def snapshot(root: Path) -> dict[str, object]:
    """Every entry below ``root`` (links not followed): contents of files, targets of links."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                out[rel] = Path(path).read_bytes()
    return out


def leaked(result: ToolResult) -> bool:
    """Whether anything of the outside tree reached the result (content, details, anything)."""
    shown = repr(result)
    return SECRET in shown or OUTSIDE_ONLY in shown


async def call(ctx: ToolContext, tool: str, arguments: dict[str, Any]) -> ToolResult:
    return await ToolRegistry(default_tools()).invoke(tool, arguments, ctx)


def swap_for_link(victim: Path, target: str) -> None:
    """Replace the file or directory ``victim`` with a symlink to ``target``."""
    if victim.is_dir() and not victim.is_symlink():
        shutil.rmtree(victim)
    else:
        victim.unlink()
    victim.symlink_to(target)


def plant_after_resolve(monkeypatch: pytest.MonkeyPatch, plant: Callable[[], None]) -> list[Path]:
    """Make every file tool run ``plant`` right after ``resolve_in_workspace`` answered (the
    window between the check and the open), once; the list records what was resolved."""
    resolved: list[Path] = []
    real = paths.resolve_in_workspace

    def hooked(workspace: Path, path: str) -> Path:
        answer = real(workspace, path)
        if not resolved:
            plant()
        resolved.append(answer)
        return answer

    # every file tool resolves its path through the backend (LocalOperations.resolve)
    monkeypatch.setattr(ops_module, "resolve_in_workspace", hooked)
    return resolved


@dataclass(frozen=True)
class Swap:
    """Call ``tool`` with ``arguments``; between its check and its open, ``victim`` (relative to
    the workspace) becomes a symlink to ``target`` (``{out}``: the outside tree, ``{ws}``: the
    workspace)."""

    tool: str
    arguments: dict[str, Any]
    victim: str
    target: str

    def link_target(self, ws: Path, out: Path) -> str:
        return self.target.format(out=out, ws=ws)


OUT_SWAPS = [
    Swap("read", {"path": "doc.txt"}, "doc.txt", "{out}/secret.txt"),
    Swap("read", {"path": "doc.txt"}, "doc.txt", "../outside/secret.txt"),
    Swap("read", {"path": "sub/doc.txt"}, "sub", "{out}"),
    Swap("read", {"path": "sub/doc.txt"}, "sub", "elsewhere/../../outside"),
    Swap("write", {"path": "doc.txt", "content": "pwned"}, "doc.txt", "{out}/secret.txt"),
    Swap("write", {"path": "sub/doc.txt", "content": "pwned"}, "sub", "{out}"),
    Swap("write", {"path": "sub/new/deep.txt", "content": "pwned"}, "sub", "../outside"),
    Swap("edit", {"path": "doc.txt", "old_text": "alpha", "new_text": "pwned"}, "doc.txt",
         "{out}/secret.txt"),
    Swap("edit", {"path": "sub/doc.txt", "old_text": "alpha", "new_text": "pwned"}, "sub",
         "{out}"),
    Swap("ls", {"path": "sub"}, "sub", "{out}"),
    Swap("ls", {"path": "sub"}, "sub", "elsewhere/.."),  # inside, but then the next check
    Swap("glob", {"pattern": "*", "path": "sub"}, "sub", "{out}"),
    Swap("grep", {"pattern": "SECRET|alpha", "path": "sub"}, "sub", "{out}"),
    Swap("grep", {"pattern": "SECRET|alpha", "path": "doc.txt"}, "doc.txt", "{out}/secret.txt"),
]  # fmt: skip


@pytest.mark.parametrize(
    "swap",
    [s for s in OUT_SWAPS if s.target != "elsewhere/.."],
    ids=lambda s: f"{s.tool}-{s.victim}->{s.target}",
)
async def test_a_link_out_planted_after_the_check_is_refused(
    ctx: ToolContext, outside: Path, monkeypatch: pytest.MonkeyPatch, swap: Swap
) -> None:
    before = snapshot(outside)
    victim = ctx.workspace / swap.victim
    resolved = plant_after_resolve(
        monkeypatch, lambda: swap_for_link(victim, swap.link_target(ctx.workspace, outside))
    )
    result = await call(ctx, swap.tool, swap.arguments)
    assert resolved and victim.is_symlink()  # the swap did happen between check and open
    assert result.is_error and result.error_kind == "path_escape", result
    assert "outside the workspace" in repr(result.content)
    assert not leaked(result)
    assert snapshot(outside) == before


async def test_a_chain_of_links_that_ends_outside_is_refused(
    ctx: ToolContext, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plant() -> None:
        (ctx.workspace / "hop").symlink_to(outside)  # a link inside, leading out
        swap_for_link(ctx.workspace / "sub", "elsewhere/../hop")

    plant_after_resolve(monkeypatch, plant)
    result = await call(ctx, "read", {"path": "sub/doc.txt"})
    assert result.error_kind == "path_escape", result
    assert not leaked(result)


@dataclass(frozen=True)
class Inside:
    """A swap whose link stays inside: the call works, on the link's target."""

    swap: Swap
    expect: str  # in the result's text
    changed: str | None = None  # a file (relative to the workspace) that must now hold "new"


IN_SWAPS = [
    Inside(Swap("read", {"path": "doc.txt"}, "doc.txt", "elsewhere/real.txt"), "real alpha"),
    Inside(Swap("read", {"path": "doc.txt"}, "doc.txt", "{ws}/elsewhere/real.txt"), "real alpha"),
    Inside(Swap("read", {"path": "sub/doc.txt"}, "sub", "elsewhere"), "elsewhere alpha"),
    Inside(Swap("read", {"path": "sub/doc.txt"}, "sub", "{ws}/elsewhere"), "elsewhere alpha"),
    Inside(Swap("write", {"path": "sub/new.txt", "content": "new"}, "sub", "elsewhere"),
           "Created", changed="elsewhere/new.txt"),
    Inside(Swap("write", {"path": "doc.txt", "content": "new"}, "doc.txt", "elsewhere/real.txt"),
           "Wrote", changed="elsewhere/real.txt"),
    Inside(Swap("edit", {"path": "doc.txt", "old_text": "real alpha", "new_text": "new"},
                "doc.txt", "{ws}/elsewhere/real.txt"), "Edited", changed="elsewhere/real.txt"),
    Inside(Swap("ls", {"path": "sub"}, "sub", "elsewhere"), "real.txt"),
    Inside(Swap("glob", {"pattern": "*", "path": "sub"}, "sub", "elsewhere"), "sub/real.txt"),
    Inside(Swap("grep", {"pattern": "alpha", "path": "sub"}, "sub", "{ws}/elsewhere"),
           "sub/real.txt:1:real alpha"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case", IN_SWAPS, ids=lambda c: f"{c.swap.tool}-{c.swap.victim}->{c.swap.target}"
)
async def test_a_link_inside_planted_after_the_check_still_works(
    ctx: ToolContext, outside: Path, monkeypatch: pytest.MonkeyPatch, case: Inside
) -> None:
    swap = case.swap
    victim = ctx.workspace / swap.victim
    plant_after_resolve(
        monkeypatch, lambda: swap_for_link(victim, swap.link_target(ctx.workspace, outside))
    )
    result = await call(ctx, swap.tool, swap.arguments)
    assert not result.is_error, result
    assert case.expect in repr(result.content)
    assert victim.is_symlink()  # written through, never replaced
    if case.changed is not None:
        assert (ctx.workspace / case.changed).read_text().rstrip("\n") == "new"


# The backend's own contract, without a tool in front of it.


async def test_backend_refuses_what_the_tool_check_would_have(
    ctx: ToolContext, outside: Path
) -> None:
    ops, ws = LocalOperations(), ctx.workspace
    (ws / "out").symlink_to(outside)
    (ws / "up").symlink_to("sub/../..")
    for path in (outside / "secret.txt", ws / "out" / "secret.txt", ws / "sub/../../x",
                 ws / "up" / "outside" / "secret.txt"):  # fmt: skip
        with pytest.raises(PathEscape):
            await ops.read_bytes(path, workspace=ws)
        with pytest.raises(PathEscape):
            await ops.stat(path, workspace=ws)
    with pytest.raises(PathEscape):
        await ops.write_bytes(ws / "out" / "new.txt", b"pwned", workspace=ws)
    with pytest.raises(PathEscape):
        await ops.list_dir(ws / "out", workspace=ws)
    with pytest.raises(PathEscape):
        [entry async for entry in ops.walk(ws / "out", workspace=ws)]
    assert not (outside / "new.txt").exists()


async def test_backend_reports_links_out_as_plain_entries(ctx: ToolContext, outside: Path) -> None:
    """A listing or walk says a link out is not a directory and has no size: even the kind and
    size of what lies outside stay there."""
    ops, ws = LocalOperations(), ctx.workspace
    (ws / "out").symlink_to(outside)
    (ws / "secret").symlink_to(outside / "secret.txt")
    (ws / "in").symlink_to("elsewhere")
    listed = {e.name: (e.is_dir, e.size) for e in await ops.list_dir(ws, workspace=ws)}
    assert listed["out"] == (False, 0) and listed["secret"] == (False, 0)
    assert listed["in"] == (True, 0)
    walked = {e.rel: (e.is_dir, e.is_symlink) async for e in ops.walk(ws, workspace=ws)}
    assert walked["out"] == (False, True) and walked["in"] == (True, True)
    assert not any(rel.startswith(("out/", "in/")) for rel in walked)  # links never entered


async def test_backend_gives_up_on_a_symlink_loop(ctx: ToolContext) -> None:
    ws = ctx.workspace
    (ws / "a").symlink_to("b")
    (ws / "b").symlink_to("a")
    with pytest.raises(OSError) as raised:
        await LocalOperations().read_bytes(ws / "a", workspace=ws)
    assert raised.value.errno == errno.ELOOP
    assert (await call(ctx, "read", {"path": "sub/doc.txt"})).is_error is False


async def test_write_makes_missing_directories_only_inside(ctx: ToolContext) -> None:
    ws = ctx.workspace
    (ws / "dangling").symlink_to("made/by/write")
    await LocalOperations().write_bytes(ws / "dangling" / "f.txt", b"x", workspace=ws)
    assert (ws / "made" / "by" / "write" / "f.txt").read_bytes() == b"x"
    assert not any(p.name.endswith(".tmp") for p in (ws / "made/by/write").iterdir())


# The race: a thread swaps names in the workspace while the tools run.

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchanger() -> Callable[[Path, Path], None] | None:
    """Atomic exchange of two names (``renameat2(RENAME_EXCHANGE)``), so the swapped name
    always exists and is always either the real thing or the link; ``None`` without it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None

    def exchange(a: Path, b: Path) -> None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), a)

    return exchange


class Racer(threading.Thread):
    """Swaps ``sub`` (a directory) and ``doc.txt`` (a file) with symlinks to the outside tree,
    over and over, at most ``max_swaps`` times or until stopped. A tool that replaces a name
    (the atomic write renames over it) can leave both names regular; the racer re-arms the
    link then, so every swap it counts is a swap between the real thing and a link out."""

    def __init__(self, ws: Path, outside: Path, max_swaps: int) -> None:
        super().__init__(daemon=True)
        exchange = _exchanger()
        if exchange is None:
            pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
        self.exchange = exchange
        self.ws, self.outside, self.max_swaps = ws, outside, max_swaps
        self.stop = threading.Event()
        self.swaps = 0
        self.pairs = [
            (ws / "sub", ws / "sub.swap", outside),
            (ws / "doc.txt", ws / "doc.swap", outside / "secret.txt"),
        ]
        for _, spare, target in self.pairs:
            spare.symlink_to(target)

    def run(self) -> None:
        while self.swaps < self.max_swaps and not self.stop.is_set():
            for name, spare, target in self.pairs:
                if not (name.is_symlink() or spare.is_symlink()):
                    tmp = spare.with_name(spare.name + ".new")
                    tmp.symlink_to(target)
                    tmp.replace(spare)
                try:
                    self.exchange(name, spare)
                except FileNotFoundError:
                    continue  # a name is being replaced right now
                self.swaps += 1

    def __enter__(self) -> Racer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=30)


RACE_ROUNDS = 400
RACE_CALLS = {
    "read": [("read", {"path": "doc.txt"}), ("read", {"path": "sub/doc.txt"})],
    "write": [
        ("write", {"path": "doc.txt", "content": f"{INSIDE}\n"}),
        ("write", {"path": "sub/doc.txt", "content": f"{INSIDE}\n"}),
    ],
    "edit": [
        ("edit", {"path": "doc.txt", "old_text": "alpha", "new_text": "alpha."}),
        ("edit", {"path": "sub/doc.txt", "old_text": "alpha", "new_text": "alpha."}),
    ],
    "ls": [("ls", {"path": "sub"}), ("ls", {"path": "."})],
    "grep": [
        ("grep", {"pattern": "SECRET|alpha", "path": "sub"}),
        ("grep", {"pattern": "SECRET|alpha", "path": "doc.txt"}),
        ("grep", {"pattern": "SECRET|alpha"}),
    ],
    "glob": [("glob", {"pattern": "**/*", "path": "sub"})],
}


@pytest.mark.parametrize("tool", sorted(RACE_CALLS))
async def test_tools_racing_a_link_swapper_never_leave_the_workspace(
    ctx: ToolContext, outside: Path, tool: str
) -> None:
    before = snapshot(outside)
    calls = RACE_CALLS[tool]
    results: list[ToolResult] = []
    with Racer(ctx.workspace, outside, max_swaps=2_000_000) as racer:
        for i in range(RACE_ROUNDS):
            name, arguments = calls[i % len(calls)]
            results.append(await call(ctx, name, arguments))
    leaks = [r for r in results if leaked(r)]
    assert not leaks, leaks[0]
    assert snapshot(outside) == before
    assert not [r for r in results if r.error_kind == "internal"]  # failures stay typed
    assert racer.swaps > 0
    # The race was run, both ways: calls worked on the real tree and calls met the link.
    assert any(not r.is_error for r in results)
    assert any(r.error_kind == "path_escape" for r in results)
