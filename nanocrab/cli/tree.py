"""The session tree around a run, as ``nanocrab replay`` prints it under the timeline: the forks
that led to the run's session, then the branches forked from the run (``nanocrab branch``)."""

from __future__ import annotations

from rich.tree import Tree

from nanocrab.branching import RunTree


def tree_view(run_id: str, session_id: str | None, tree: RunTree) -> Tree:
    """Root session at the top, one level per fork down to the run, its branches under it."""
    root = tree.lineage[0].parent_session_id if tree.lineage else session_id
    top = Tree(f"[bold]session tree[/] · root session {root or '(none)'}")
    node = top
    for fork in tree.lineage:
        node = node.add(
            f"branch [cyan]{fork.session_id}[/] ← {fork.at_type} {fork.at_event_id} "
            f"(seq {fork.at_seq}) of run {fork.parent_run_id}"
        )
    here = node.add(f"[bold magenta]this run {run_id}[/] (session {session_id or '-'})")
    for branch in tree.branches:
        b = branch.branched
        runs = ", ".join(branch.runs) or "no runs yet"
        here.add(
            f"branch [cyan]{b.session_id}[/] ← {b.at_type} {b.at_event_id} (seq {b.at_seq})"
            f"{f' by {b.by}' if b.by else ''}: {runs}"
        )
    return top
