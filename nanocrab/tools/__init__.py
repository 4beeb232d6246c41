"""Host tools: files, shell and web, confined to a workspace, run through an operations backend.

A tool is a small class (:class:`Tool`) with a pydantic argument schema and
``run(args, ctx) -> ToolResult``; the :class:`ToolRegistry` validates arguments, describes tools
to the model and turns every failure into a typed error result.
"""

from nanocrab.tools.base import (
    ArtifactStore,
    OutputSink,
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolResult,
)
from nanocrab.tools.edit import EditArgs, EditTool
from nanocrab.tools.globbing import GlobArgs, GlobTool, compile_glob
from nanocrab.tools.grep import GrepArgs, GrepTool
from nanocrab.tools.hosts import HostAllowList, normalise_host
from nanocrab.tools.listing import LsArgs, LsTool
from nanocrab.tools.ops import (
    DirEntry,
    FileInfo,
    LocalOperations,
    Operations,
    ProcessOutcome,
    WalkEntry,
)
from nanocrab.tools.paths import resolve_in_workspace
from nanocrab.tools.process import kill_tree, run_local_process
from nanocrab.tools.read import ReadArgs, ReadTool
from nanocrab.tools.registry import ToolRegistry, default_tools
from nanocrab.tools.search import (
    BraveSearch,
    SearchHit,
    SearchProvider,
    TavilySearch,
    WebSearchArgs,
    WebSearchTool,
    make_search_provider,
)
from nanocrab.tools.shell import ExecArgs, ExecTool
from nanocrab.tools.web import WebFetchArgs, WebFetchTool
from nanocrab.tools.write import WriteArgs, WriteTool

__all__ = [
    "ArtifactStore",
    "BraveSearch",
    "DirEntry",
    "EditArgs",
    "EditTool",
    "ExecArgs",
    "ExecTool",
    "FileInfo",
    "GlobArgs",
    "GlobTool",
    "GrepArgs",
    "GrepTool",
    "HostAllowList",
    "LocalOperations",
    "LsArgs",
    "LsTool",
    "Operations",
    "OutputSink",
    "ProcessOutcome",
    "ReadArgs",
    "ReadTool",
    "SearchHit",
    "SearchProvider",
    "TavilySearch",
    "Tool",
    "ToolArgs",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "WalkEntry",
    "WebFetchArgs",
    "WebFetchTool",
    "WebSearchArgs",
    "WebSearchTool",
    "WriteArgs",
    "WriteTool",
    "compile_glob",
    "default_tools",
    "kill_tree",
    "make_search_provider",
    "normalise_host",
    "resolve_in_workspace",
    "run_local_process",
]
