"""The scanner's tables: allowed modules, permissions, and which names break which rule.

Kept apart from the walker in :mod:`nanocrab.capabilities.scan` so the policy of what is
allowed reads as data; the rules themselves are described in that module's docstring.
"""

from __future__ import annotations

import builtins
import re


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _rule(rule: str, names: str, *, prefix: str = "") -> dict[str, str]:
    return {f"{prefix}{name}": rule for name in names.split()}


PERMISSIONS: frozenset[str] = frozenset({"fs.read", "fs.write", "net"})
"""The permission vocabulary: read files, write files, open network connections."""

MAX_SOURCE_CHARS = 200_000

ALLOWED_MODULES: frozenset[str] = _words(
    "__future__ json math re statistics collections itertools functools datetime decimal "
    "fractions string textwrap unicodedata csv io dataclasses typing enum heapq bisect random "
    "hashlib base64 uuid copy operator pathlib difflib html zlib gzip"
)
"""Top-level modules a capability may import (submodules included, e.g. ``collections.abc``)."""

_NETWORK_MODULES = (
    "socket _socket ssl http urllib urllib3 requests httpx aiohttp ftplib smtplib poplib "
    "imaplib telnetlib xmlrpc socketserver websocket websockets asyncio"
)

RULES: dict[str, str] = {
    "syntax_error": "fix the syntax so the module parses",
    "too_complex": "keep the module small and its expressions shallowly nested",
    "import_not_allowed": f"allowed imports: {', '.join(sorted(ALLOWED_MODULES))}",
    "star_import": "import the names you use explicitly",
    "process": "capabilities may not start processes or send signals; compute in Python",
    "dynamic_code": "capabilities may not evaluate, compile or import code at run time; "
    "write the code directly",
    "dynamic_attribute": "reflection on builtins, modules, frames and dunder attributes is not "
    "allowed; use plain attribute syntax with a literal name (type(x) instead of x.__class__)",
    "private_access": "use the module's public API, not its _private internals",
    "file_delete": "capabilities may not delete or move files",
    "unsafe_deserialization": "unpickling can run arbitrary code; use json",
    "native_code": "capabilities may not load native code",
    "runtime_control": "capabilities may not start threads, handle signals, exit, read stdin, "
    "or change interpreter, module or process state",
    "network": "network access needs the 'net' permission: declare it in "
    "CAPABILITY['permissions'] or take the data as a parameter",
    "fs_write": "writing files needs the 'fs.write' permission: declare it in "
    "CAPABILITY['permissions'] or return the data instead",
    "fs_read": "reading files needs the 'fs.read' permission: declare it in "
    "CAPABILITY['permissions'] or take the content as a parameter",
    "unknown_permission": f"declare only {', '.join(sorted(PERMISSIONS))}",
    "unused_permission": "drop permissions the code does not need",
}
"""Every rule name, with the advice appended to its findings' messages."""

GATES = {"network": "net", "fs_write": "fs.write", "fs_read": "fs.read"}
WARNINGS = frozenset({"fs_read", "unused_permission"})

MODULE_RULES: dict[str, str] = {
    **_rule("process", "subprocess pty multiprocessing concurrent"),
    **_rule("dynamic_code", "importlib builtins code codeop runpy imp zipimport pdb"),
    **_rule("unsafe_deserialization", "pickle _pickle marshal shelve copyreg dill cloudpickle"),
    **_rule("native_code", "ctypes _ctypes cffi"),
    **_rule("runtime_control", "threading _thread signal"),
    **_rule("network", _NETWORK_MODULES),
}
"""Modules with a specific rule: their import and every use is a finding."""

QNAME_RULES: dict[str, str] = {
    **_rule("dynamic_code", "eval exec compile __import__ breakpoint", prefix="builtins."),
    **_rule(
        "dynamic_attribute",
        "getattr hasattr setattr delattr vars globals locals",
        prefix="builtins.",
    ),
    # A reference to open that is not a call: the mode it will be called with is unknown.
    "builtins.open": "fs_write",
    "builtins.help": "process",  # pydoc may start a pager
    **_rule("runtime_control", "input exit quit", prefix="builtins."),
    **_rule("process", "system popen kill killpg startfile", prefix="os."),
    **_rule("process", "asyncio.subprocess uuid.getnode uuid.uuid1"),
    **_rule("dynamic_code", "get_type_hints ForwardRef", prefix="typing."),
    **_rule("dynamic_attribute", "attrgetter methodcaller", prefix="operator."),
    **_rule("file_delete", "remove unlink rmdir removedirs", prefix="os."),
    **_rule("file_delete", "rmtree move", prefix="shutil."),
    **_rule(
        "fs_write",
        "mkdir makedirs rename renames replace chmod chown lchown link symlink truncate mkfifo "
        "mknod utime",
        prefix="os.",
    ),
    **_rule(
        "fs_write",
        "copy copy2 copyfile copytree copymode copystat chown make_archive unpack_archive",
        prefix="shutil.",
    ),
    **_rule(
        "runtime_control",
        "modules setrecursionlimit settrace setprofile exit path meta_path path_hooks addaudithook",
        prefix="sys.",
    ),
    **_rule("runtime_control", "update setdefault pop popitem clear", prefix="os.environ."),
    **_rule("runtime_control", "putenv unsetenv _exit abort chdir", prefix="os."),
}
"""Qualified names (and anything under them) that are findings wherever they appear."""

QNAME_STEMS = tuple(
    (stem, "process")
    for stem in ("os.exec", "os.spawn", "os.posix_spawn", "os.fork", "asyncio.create_subprocess")
)

ATTR_RULES: dict[str, str] = {
    **_rule("file_delete", "unlink rmdir removedirs rmtree"),
    **_rule(
        "fs_write",
        "write_text write_bytes touch mkdir makedirs symlink_to hardlink_to link_to chmod lchmod "
        "rename",
    ),
    **_rule(
        "process",
        "create_subprocess_exec create_subprocess_shell subprocess_exec subprocess_shell",
    ),
    **_rule(
        "network",
        "open_connection open_unix_connection start_server start_unix_server "
        "create_connection create_unix_connection create_server create_datagram_endpoint "
        "sock_connect",
    ),
}
"""Attribute names that are findings on any receiver (the receiver's type is unknown)."""

READ_CALLS = _words(
    "read_text read_bytes iterdir glob rglob stat lstat exists is_file is_dir is_symlink "
    "readlink samefile expanduser home cwd"
)
"""Methods that read the file system when called; only a warning, so generic names are tolerable."""

INTROSPECTION = _words(
    "gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code ag_await "
    "f_globals f_locals f_builtins f_back f_code f_trace tb_frame tb_next co_code co_consts "
    "co_names get_field _getframe func_globals"
)
"""Attributes that reach frames, code objects or arbitrary objects by name."""

ALLOWED_DUNDER_NAMES = _words(
    "__name__ __doc__ __qualname__ __module__ __all__ __slots__ __version__ __debug__ "
    "__author__ __match_args__"
)
ALLOWED_DUNDER_ATTRS = _words(
    "__init__ __post_init__ __name__ __qualname__ __doc__ __eq__ __ne__ __lt__ __le__ __gt__ "
    "__ge__ __hash__ __repr__ __str__ __len__ __iter__ __next__ __contains__ __getitem__ "
    "__setitem__ __delitem__ __bool__ __enter__ __exit__ __version__"
)
ALLOWED_DUNDER_STRINGS = ALLOWED_DUNDER_NAMES | ALLOWED_DUNDER_ATTRS | {"__main__", "__pycache__"}
DUNDER = re.compile(r"__[A-Za-z][A-Za-z0-9_]*?__")

BUILTIN_NAMES = frozenset(dir(builtins))
ALWAYS_BUILTIN = _words(
    "eval exec compile __import__ breakpoint getattr hasattr setattr delattr vars globals locals "
    "open"
)
"""Builtins judged even where the module binds the name (``if False: eval = 1`` proves nothing)."""

OPEN_LIKE = _words("builtins.open io.open io.FileIO gzip.open gzip.GzipFile")
ATTR_BUILTINS = _words("builtins.getattr builtins.hasattr builtins.setattr builtins.delattr")
