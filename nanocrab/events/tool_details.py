"""Typed details a tool returns beside its content blocks (one struct per tool, tagged by tool).

The content blocks are what the model sees; details are for people and programs: a timeline,
an audit view, a UI rendering a diff. They never carry large payloads (those are artifacts).
"""

from __future__ import annotations

import msgspec

from nanocrab.events.capabilities import SandboxOutcome


class ReadDetails(msgspec.Struct, frozen=True, tag="read", kw_only=True):
    path: str
    offset: int  # first line returned, 1-based
    lines: int  # lines returned
    total_lines: int
    truncated: bool = False
    next_offset: int | None = None  # where to continue when truncated
    # an image file, returned as an image block (offset 1, lines and total_lines 0): its type,
    # the bytes the model was given, their pixel size when known, whether it was scaled down
    media_type: str | None = None
    image_bytes: int = 0
    width: int | None = None
    height: int | None = None
    resized: bool = False


class WriteDetails(msgspec.Struct, frozen=True, tag="write", kw_only=True):
    path: str
    bytes_written: int
    created: bool


class EditDetails(msgspec.Struct, frozen=True, tag="edit", kw_only=True):
    path: str
    diff: str  # unified diff
    first_changed_line: int


class LsDetails(msgspec.Struct, frozen=True, tag="ls", kw_only=True):
    path: str
    entries: int
    truncated: bool = False


class GlobDetails(msgspec.Struct, frozen=True, tag="glob", kw_only=True):
    pattern: str
    matches: int
    truncated: bool = False


class GrepDetails(msgspec.Struct, frozen=True, tag="grep", kw_only=True):
    pattern: str
    matches: int
    files: int
    truncated: bool = False


class ExecDetails(msgspec.Struct, frozen=True, tag="exec", kw_only=True):
    command: str
    exit_code: int | None  # None when killed
    duration_ms: float
    timed_out: bool = False
    aborted: bool = False
    truncated: bool = False
    output_bytes: int = 0
    # whether the command ran in the operating-system sandbox (events from before it existed
    # decode as False, which is what they were), and why not when it did not
    confined: bool = False
    unconfined_reason: str | None = None


class WebFetchDetails(msgspec.Struct, frozen=True, tag="web_fetch", kw_only=True):
    url: str
    status: int
    content_type: str
    bytes: int
    truncated: bool = False


class WebSearchDetails(msgspec.Struct, frozen=True, tag="web_search", kw_only=True):
    """One search: which provider and API host answered, the query, the result URLs (the
    snippets are in the content; the API key is never recorded)."""

    provider: str
    host: str
    query: str
    results: int
    urls: list[str] = []


class SkillDetails(msgspec.Struct, frozen=True, tag="skill", kw_only=True):
    name: str
    resource: str | None = None
    bytes: int = 0


class SpawnDetails(msgspec.Struct, frozen=True, tag="spawn", kw_only=True):
    child_run_id: str
    steps: int = 0


class CapabilityDetails(msgspec.Struct, frozen=True, tag="capability", kw_only=True):
    """One run of a generated capability in the sandbox (the executor also records it as
    ``capability.invoked`` for the registry's statistics)."""

    name: str
    version: str
    ok: bool
    outcome: SandboxOutcome
    duration_ms: float = 0.0
    peak_memory_bytes: int = 0
    fuel_used: int = 0
    error: str | None = None


class PythonDetails(msgspec.Struct, frozen=True, tag="python", kw_only=True):
    """One ``python`` tool call in the sandbox: how it ended and what it used."""

    outcome: SandboxOutcome
    duration_ms: float = 0.0
    peak_memory_bytes: int = 0
    fuel_used: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files_written: list[str] = []


ToolDetails = (
    ReadDetails | WriteDetails | EditDetails | LsDetails | GlobDetails | GrepDetails
    | ExecDetails | WebFetchDetails | WebSearchDetails | SkillDetails | SpawnDetails
    | CapabilityDetails | PythonDetails
)  # fmt: skip
