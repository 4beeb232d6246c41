"""Example Python agent: counts TODO markers in the workspace (docs/agents.md).

A deterministic multi-tool job: ``ls`` the directory named in the task (default: the workspace
root), ``grep`` it for ``TODO``, ``read`` the file with the most of them, and answer with the
counts. Every call goes through the run's policy like a model's would: asked for a directory
the policy does not allow (``count TODOs in /etc``), the agent gets the denial and says so.
"""

from __future__ import annotations

import re
from collections import Counter

from nanocrab.pyagent import Agent, Context, Request, Response

_PATH = re.compile(r"\bin\s+(\S+)")


class TodoCounter(Agent):
    async def handle(self, request: Request, context: Context) -> Response:
        found = _PATH.search(request.text)
        where = found.group(1).rstrip(".?!") if found else "."
        listing = await context.tools.call("ls", {"path": where})
        if listing.denied:
            context.log(f"not allowed to look in {where}: {listing.text}", level="warning")
            return Response(f"I may not look in {where}: {listing.text}")
        if not listing.ok:
            return Response(f"I could not list {where}: {listing.text}")
        grep = await context.tools.call("grep", {"pattern": r"\bTODO\b", "path": where})
        if grep.denied:
            return Response(f"I may not search {where}: {grep.text}")
        per_file: Counter[str] = Counter()
        for line in grep.text.splitlines():
            path, sep, _rest = line.partition(":")
            if sep and _rest.split(":", 1)[0].isdigit():
                per_file[path] += 1
        total = sum(per_file.values())
        context.emit_metric("todos", total, labels={"scope": where})
        if not total:
            return Response(f"No TODOs in {where}.")
        top, count = per_file.most_common(1)[0]
        head = await context.tools.call("read", {"path": top, "limit": 50})
        first = next((ln.strip() for ln in head.text.splitlines() if "TODO" in ln), "")
        files = ", ".join(f"{p}: {n}" for p, n in sorted(per_file.items()))
        n = len(per_file)
        return Response(
            f"{total} TODO{'s' if total > 1 else ''} in {n} file{'s' if n > 1 else ''} "
            f"({files}). Most in {top} ({count}), first: {first}"
        )


async def smoke(harness) -> None:  # type: ignore[no-untyped-def]
    """Run on every new version before it is activated (in a subprocess, time-limited)."""
    answer = await harness.run(
        "count TODOs",
        tools={
            "ls": lambda a: "a.py\nb.py\n",
            "grep": lambda a: "a.py:1:# TODO one\na.py:3:# TODO two\nb.py:2:# TODO three\n",
            "read": lambda a: "# TODO one\nx = 1\n# TODO two\n",
        },
    )
    assert answer.text.startswith("3 TODOs in 2 files"), answer.text
    denied = await harness.run("count TODOs in /etc", tools={})
    assert "may not look" in denied.text, denied.text
