"""No symlink out of the workspace, from either side (issue 9, item 5).

Guest side: sandboxed Python with the workspace mounted writable (``write: true``) cannot create
a symlink or a hard link at all, and a link it moves so that it points outside is removed after
the run and reported, never listed as written. Host side: a link pointing outside that got into
the workspace anyway (planted by another process, simulated here by the test) is refused by
every file tool, while links inside the workspace keep working.

Shares the session's compiled-interpreter cache with tests/test_sandbox.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nanocrab.events import PythonDetails, TextBlock
from nanocrab.sandbox import Mount, Sandbox
from nanocrab.tools import ToolRegistry, ToolResult, default_tools
from tests.test_tools_support import make_ctx

SECRET = "top secret\n"


@pytest.fixture(scope="session")
def box(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    sandbox = Sandbox(tmp_path_factory.getbasetemp() / "sandbox-cache")
    sandbox.warm()
    return sandbox


@pytest.fixture(scope="session")
def registry(box: Sandbox) -> ToolRegistry:
    return ToolRegistry(default_tools(sandbox=box))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """tmp/outside/secret.txt, next to the workspace."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text(SECRET)
    return out


@pytest.fixture
def ws(tmp_path: Path, outside: Path) -> Path:
    """tmp/ws/a/b with notes.txt at the top and inside.txt in a/b."""
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "notes.txt").write_text("alpha\nbeta\n")
    (ws / "a" / "b" / "inside.txt").write_text("inside\n")
    return ws


def text(result: ToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextBlock))


async def python(registry: ToolRegistry, ws: Path, code: str, *, write: bool = True) -> ToolResult:
    return await registry.invoke("python", {"code": code, "write": write}, make_ctx(ws))


def tree(root: Path) -> dict[str, str]:
    """Every entry below ``root``: ``-> target`` for links, ``file``/``dir`` otherwise."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            kind = "dir" if path.is_dir() else "file"
            seen[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else kind
    return seen


# --- the guest cannot plant links -------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "/etc/passwd",  # absolute (cap-std refuses these on its own)
        "../../../etc/passwd",  # relative, climbing out of /workspace
        "../outside/secret.txt",  # relative, to a real file next to the workspace
        "a/../../outside/secret.txt",  # climbing out through a real directory
        "notes.txt",  # even one inside: its meaning could change once the tree around it does
    ],
)
async def test_the_guest_cannot_create_a_symlink(
    registry: ToolRegistry, ws: Path, outside: Path, target: str
) -> None:
    before = tree(ws)
    result = await python(registry, ws, f"import os\nos.symlink({target!r}, '/workspace/x')")
    assert result.is_error and result.error_kind == "failed", text(result)
    assert "[error: PermissionError: [Errno 63] Operation not permitted" in text(result)
    assert isinstance(result.details, PythonDetails) and result.details.files_written == []
    assert tree(ws) == before
    after = await python(registry, ws, "open('notes.txt').read()")  # the next call still works
    assert not after.is_error and text(after) == 'result: "alpha\\nbeta\\n"'


async def test_the_guest_cannot_create_a_hard_link(
    registry: ToolRegistry, ws: Path, outside: Path
) -> None:
    before = tree(ws)
    code = (
        "import os\n"
        "found = []\n"
        "for source, name in (('notes.txt', 'twin'), ('../outside/secret.txt', 'stolen'),\n"
        "                     ('/usr/local/lib/python3.11/os.py', 'lib')):\n"
        "    try:\n"
        "        os.link(source, name)\n"
        "        found.append('linked')\n"
        "    except OSError as exc:\n"
        "        found.append(type(exc).__name__)\n"
        "found"
    )
    result = await python(registry, ws, code)
    assert not result.is_error, text(result)
    assert text(result) == 'result: ["PermissionError", "PermissionError", "PermissionError"]'
    assert tree(ws) == before
    assert os.stat(ws / "notes.txt").st_nlink == 1
    assert os.stat(outside / "secret.txt").st_nlink == 1


async def test_a_plain_sandbox_run_refuses_links_too(box: Sandbox, ws: Path) -> None:
    """The refusal is the sandbox's own (its WASI imports), not the python tool's."""
    code = (
        "import os\n"
        "ws = '/workspace/'\n"
        "for make in (lambda: os.symlink('../outside', ws + 'l'),\n"
        "             lambda: os.link(ws + 'notes.txt', ws + 'h')):\n"
        "    try:\n"
        "        make()\n"
        "        print('made')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    result = await box.run(code, mounts=[Mount(ws, "/workspace", writable=True)])
    assert result.outcome == "ok", result.stderr
    assert result.stdout == "refused\nrefused\n"
    assert not (ws / "l").is_symlink() and not (ws / "h").exists()


async def test_a_link_the_guest_moves_out_is_removed_and_reported(
    registry: ToolRegistry, ws: Path, outside: Path
) -> None:
    """The guest can rename links already in the workspace: ``a/b/up -> ../../outside`` points
    at ws/outside (inside); moved to the top it points at tmp/outside. The run's sweep removes
    it; a link that already pointed outside and was left alone is the owner's and stays."""
    (ws / "a" / "b" / "up").symlink_to("../../outside")
    (ws / "outside").mkdir()
    (ws / "owners").symlink_to(outside)  # pointed outside before the run; untouched
    code = (
        "import os\n"
        "os.rename('a/b/up', 'up')\n"
        "print(os.readlink('up'))\n"
        "open('report.txt', 'w').write('done')"
    )
    result = await python(registry, ws, code)
    assert not result.is_error, text(result)
    assert text(result) == (
        "stdout:\n../../outside\n\nresult: 4\n\n"
        "[removed symlinks that pointed outside the workspace: up]"
    )
    assert isinstance(result.details, PythonDetails)
    assert result.details.files_written == ["report.txt"]
    assert "up" not in tree(ws) and "a/b/up" not in tree(ws)
    assert os.readlink(ws / "owners") == str(outside)
    assert (outside / "secret.txt").read_text() == SECRET


async def test_a_directory_moved_with_its_links_is_swept(
    registry: ToolRegistry, ws: Path, outside: Path
) -> None:
    """Renaming a directory moves the relative links inside it: a/b/deep -> ../../notes.txt
    (ws/notes.txt) becomes b/deep -> ../../notes.txt, i.e. tmp/notes.txt: outside."""
    (ws / "a" / "b" / "deep").symlink_to("../../notes.txt")
    result = await python(registry, ws, "import os\nos.rename('a/b', 'b')")
    assert not result.is_error, text(result)
    assert "[removed symlinks that pointed outside the workspace: b/deep]" in text(result)
    assert isinstance(result.details, PythonDetails)
    assert "b/deep" not in result.details.files_written
    assert "b/deep" not in tree(ws)
    assert (ws / "b" / "inside.txt").read_text() == "inside\n"


async def test_links_inside_the_workspace_still_work_for_the_guest(
    registry: ToolRegistry, ws: Path
) -> None:
    (ws / "alias").symlink_to("a/b/inside.txt")
    (ws / "a" / "b" / "home").symlink_to("../..")  # the workspace itself: inside
    code = "import os\nos.rename('alias', 'a/alias2')\n[open('a/b/home/notes.txt').read()]"
    result = await python(registry, ws, code)
    assert not result.is_error, text(result)
    assert text(result) == 'result: ["alpha\\nbeta\\n"]'  # a/alias2 -> a/b/inside.txt: kept
    assert os.readlink(ws / "a" / "alias2") == "a/b/inside.txt"
    assert isinstance(result.details, PythonDetails)
    assert result.details.files_written == ["a/alias2"]


# --- host tools refuse links that point outside -----------------------------------------------


def plant(ws: Path, outside: Path) -> None:
    """Links to outside the workspace, as another process could leave them."""
    (ws / "abs.txt").symlink_to(outside / "secret.txt")
    (ws / "a" / "b" / "rel.txt").symlink_to("../../../outside/secret.txt")
    (ws / "dir").symlink_to("../outside")
    (ws / "dangling.txt").symlink_to(outside / "made-by-a-tool.txt")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read", {"path": "abs.txt"}),
        ("read", {"path": "a/b/rel.txt"}),
        ("read", {"path": "dir/secret.txt"}),
        ("write", {"path": "abs.txt", "content": "pwned"}),
        ("write", {"path": "a/b/rel.txt", "content": "pwned"}),
        ("write", {"path": "dir/new.txt", "content": "pwned"}),
        ("write", {"path": "dangling.txt", "content": "pwned"}),
        ("edit", {"path": "abs.txt", "old_text": "top", "new_text": "no"}),
        ("edit", {"path": "a/b/rel.txt", "old_text": "top", "new_text": "no"}),
        ("ls", {"path": "dir"}),
        ("glob", {"pattern": "*", "path": "dir"}),
        ("grep", {"pattern": "secret", "path": "abs.txt"}),
        ("grep", {"pattern": "secret", "path": "dir"}),
    ],
)
async def test_host_tools_refuse_a_planted_link(
    registry: ToolRegistry, ws: Path, outside: Path, tool: str, arguments: dict[str, str]
) -> None:
    plant(ws, outside)
    result = await registry.invoke(tool, arguments, make_ctx(ws))
    assert result.error_kind == "path_escape", result
    assert "top secret" not in text(result)
    assert (outside / "secret.txt").read_text() == SECRET
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_tree_walks_skip_planted_links(
    registry: ToolRegistry, ws: Path, outside: Path
) -> None:
    plant(ws, outside)
    (ws / "a" / "ok.txt").symlink_to("b/inside.txt")
    ctx = make_ctx(ws)
    found = await registry.invoke("glob", {"pattern": "**"}, ctx)
    assert text(found).split("\n") == [
        "a/", "a/b/", "a/b/inside.txt", "a/ok.txt", "notes.txt",
    ]  # fmt: skip
    grep = await registry.invoke("grep", {"pattern": "secret|inside"}, ctx)
    assert sorted(text(grep).split("\n")) == ["a/b/inside.txt:1:inside", "a/ok.txt:1:inside"]


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("read", {"path": "alias.txt"}, "inside"),
        ("read", {"path": "b-dir/inside.txt"}, "inside"),
        ("ls", {"path": "b-dir"}, "inside.txt"),
        ("glob", {"pattern": "*.txt", "path": "b-dir"}, "a/b/inside.txt"),
        ("grep", {"pattern": "ins", "path": "alias.txt"}, "a/b/inside.txt:1:inside"),
        ("edit", {"path": "alias.txt", "old_text": "inside", "new_text": "edited"}, "Edited"),
        ("write", {"path": "b-dir/new.txt", "content": "new"}, "Created a/b/new.txt"),
    ],
)
async def test_host_tools_follow_links_inside_the_workspace(
    registry: ToolRegistry, ws: Path, tool: str, arguments: dict[str, str], expected: str
) -> None:
    (ws / "alias.txt").symlink_to("a/b/inside.txt")
    (ws / "b-dir").symlink_to(ws / "a" / "b")
    result = await registry.invoke(tool, arguments, make_ctx(ws))
    assert not result.is_error, result
    assert expected in text(result)
