"""The model's view of a run: messages rebuilt from the run's events (and earlier runs of its
session), so nothing about a conversation lives anywhere but the log."""

from __future__ import annotations

from nanocrab.events import ContentBlock, ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock
from nanocrab.handlers.runstate import CallState, RunState, TurnState
from nanocrab.llm.base import Message

KEEP_TURNS = 2  # turns kept verbatim when compacting


def result_block(call: CallState) -> ToolResultBlock:
    if call.completed is not None:
        content = [b for b in call.completed.content if isinstance(b, TextBlock | ImageBlock)]
        return ToolResultBlock(
            tool_use_id=call.call_id,
            content=content or [TextBlock("(no output)")],
            is_error=call.completed.is_error,
        )
    if call.skipped is not None:
        why = {
            "steered": "skipped: the user sent a new message before this call ran",
            "cancelled": "skipped: the run was cancelled",
            "max_steps": "skipped: the run reached its step limit",
        }[call.skipped.reason]
        return ToolResultBlock(tool_use_id=call.call_id, content=[TextBlock(why)], is_error=True)
    if call.denied is not None:
        text = f"denied by policy: {call.denied.reason}"
        return ToolResultBlock(tool_use_id=call.call_id, content=[TextBlock(text)], is_error=True)
    return ToolResultBlock(
        tool_use_id=call.call_id, content=[TextBlock("(no result recorded)")], is_error=True
    )


def text_of(content: list[ContentBlock]) -> str:
    return "\n".join(b.text for b in content if isinstance(b, TextBlock)).strip()


def messages(state: RunState, history: list[Message] | None = None) -> list[Message]:
    """History, then the task, then each turn: assistant content and the user turn answering it
    (tool results, then any steer / follow-up messages delivered to the next turn)."""
    assert state.task is not None
    out: list[Message] = list(history or [])
    user: list[ContentBlock | ToolResultBlock] = [TextBlock(state.task.text)]
    turns = state.turns
    if state.compaction is not None:
        cut = state.compaction.turns_summarised
        user.append(TextBlock(f"[Summary of this run's earlier turns]\n{state.compaction.summary}"))
        turns = turns[cut:]
    for turn in turns:
        for message_id in turn.request.delivers:
            if (m := state.message(message_id)) is not None:
                user.append(TextBlock(m.text))
        out.append(Message(role="user", content=user))
        if turn.response is None:
            break
        out.append(Message(role="assistant", content=list(turn.response.content)))
        user = [result_block(c) for c in turn.calls]
    return _alternate(out)


def history_messages(rows: list[tuple[str, str]]) -> list[Message]:
    """A session's earlier (role, text) messages as model messages, starting with a user turn."""
    out = _alternate(
        [Message(role="assistant" if role == "assistant" else "user", content=[TextBlock(text)])
         for role, text in rows]
    )  # fmt: skip
    while out and out[0].role != "user":
        out.pop(0)
    return out


def _alternate(msgs: list[Message]) -> list[Message]:
    """Merge consecutive same-role messages (history may end with a user message)."""
    merged: list[Message] = []
    for m in msgs:
        if merged and merged[-1].role == m.role:
            merged[-1] = Message(role=m.role, content=[*merged[-1].content, *m.content])
        else:
            merged.append(m)
    return merged


def summarise_turns(turns: list[TurnState], limit: int = 300) -> str:
    """A deterministic digest of turns: what the model said, which tools ran, what came back."""
    lines: list[str] = []

    def clip(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    for turn in turns:
        if turn.response is None:
            continue
        said = text_of(turn.response.content)
        if said:
            lines.append(f"- turn {turn.index}: {clip(said)}")
        for block in turn.response.content:
            if isinstance(block, ToolUseBlock):
                call = next((c for c in turn.calls if c.call_id == block.id), None)
                result = text_of(list(result_block(call).content)) if call else ""
                lines.append(f"  - {block.name}({clip(str(block.input))}) → {clip(result)}")
    return "\n".join(lines)
