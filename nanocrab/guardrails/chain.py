"""Running the chain: :func:`check` is pure, synchronous and does no I/O.

Semantics, in file order:

- a filter *runs* when its scope matches (the checkpoint is one of its ``checkpoints``; its
  ``tools`` / ``agents`` patterns, if any, match the context);
- it *fires* when its detector reports a finding with ``score >= threshold``; only those
  findings are kept;
- ``allow`` stops the chain: later filters do not run, what earlier filters decided stands (put
  an allow filter first to exempt a trusted tool or agent);
- ``block`` stops the chain: nothing later can weaken it;
- ``redact``, ``require_approval`` and ``alert`` let the chain continue;
- the verdict's action is the strongest of the fired filters' actions
  (allow < alert < redact < require_approval < block); ``alerts`` lists the fired filters whose
  action is ``alert`` or that set ``alert: true``;
- every span found by a fired ``redact`` filter is replaced in the returned text by a
  placeholder ``<LABEL_n>``; all spans index the text as given (detectors see the original
  text, not each other's redactions), overlapping spans merge.

Placeholders are stable within a run: the caller passes the run's table in
``CheckContext.placeholders`` and keeps ``Verdict.placeholders``; a value seen before gets its
old placeholder. Keys are salted hashes of the value (``CheckContext`` has no clear values), so
the table can be stored and put in events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

from nanocrab.guardrails.config import GuardrailsConfig
from nanocrab.guardrails.model import (
    ACTION_RANK,
    Action,
    CheckContext,
    Checkpoint,
    Finding,
    Verdict,
)

_EMPTY = CheckContext()


def placeholder_key(label: str, value: str, salt: str = "") -> str:
    """The placeholder table's key for ``value``: a salted SHA-256 prefix (the salt — the
    run id, say — keeps a short value such as a phone number from being looked up by hash)."""
    digest = hashlib.sha256(f"{salt}\x00{label}\x00{value}".encode()).hexdigest()
    return f"{label}:{digest[:20]}"


def check(chain: GuardrailsConfig, checkpoint: Checkpoint, text: str,
          context: CheckContext = _EMPTY) -> Verdict:  # fmt: skip
    """Run ``chain`` on ``text`` at ``checkpoint``; see the module docstring for the rules."""
    filters_run: list[str] = []
    fired: list[str] = []
    findings: list[Finding] = []
    alerts: list[str] = []
    to_redact: list[Finding] = []
    action: Action = "allow"
    deciding: tuple[str, Finding] | None = None
    reasons: dict[str, str] = {}
    for f in chain.filters:
        if not f.applies(checkpoint, context):
            continue
        filters_run.append(f.id)
        hits = [replace(h, filter_id=f.id) for h in f.detect(text, checkpoint, context)
                if h.score >= f.threshold]  # fmt: skip
        if not hits:
            continue
        fired.append(f.id)
        findings.extend(hits)
        reasons[f.id] = f.reason
        if f.alert or f.action == "alert":
            alerts.append(f.id)
        if f.action == "redact":
            to_redact.extend(hits)
        if ACTION_RANK[f.action] > ACTION_RANK[action]:
            action = f.action
            deciding = (f.id, max(hits, key=lambda h: h.score))
        if f.action in ("allow", "block"):
            break
    redacted, table, count = _redact(text, to_redact, context.placeholders, context.salt)
    reason = ""
    if deciding is not None and action in ("block", "require_approval"):
        fid, top = deciding
        reason = reasons[fid] or _default_reason(action, fid, top)
    return Verdict(
        checkpoint=checkpoint,
        action=action,
        text=redacted,
        filters_run=tuple(filters_run),
        fired=tuple(fired),
        findings=tuple(findings),
        alerts=tuple(alerts),
        placeholders=table,
        reason=reason,
        redactions=count,
    )


def _default_reason(action: Action, fid: str, top: Finding) -> str:
    what = "blocked" if action == "block" else "needs approval"
    evidence = f"{top.label.lower().replace('_', ' ')} ({top.kind}, score {top.score:.2f})"
    return f"{what} by guardrail {fid!r}: {evidence}"


def _redact(text: str, spans: list[Finding], table_in: Mapping[str, str], salt: str,
            ) -> tuple[str, dict[str, str], int]:  # fmt: skip
    table = dict(table_in)
    if not spans:
        return text, table, 0
    merged: list[tuple[int, int, str]] = []
    for f in sorted(spans, key=lambda f: (f.start, -(f.end - f.start))):
        if merged and f.start < merged[-1][1]:
            start, end, label = merged[-1]
            merged[-1] = (start, max(end, f.end), label)
        else:
            merged.append((f.start, f.end, f.label))
    counts: dict[str, int] = {}
    for placeholder in table.values():
        label = placeholder.strip("<>").rsplit("_", 1)[0]
        counts[label] = counts.get(label, 0) + 1
    out: list[str] = []
    pos = 0
    for start, end, label in merged:
        key = placeholder_key(label, text[start:end], salt)
        if key not in table:
            counts[label] = counts.get(label, 0) + 1
            table[key] = f"<{label}_{counts[label]}>"
        out.append(text[pos:start])
        out.append(table[key])
        pos = end
    out.append(text[pos:])
    return "".join(out), table, len(merged)


def prescreen(chain: GuardrailsConfig, checkpoint: Checkpoint, text: str,
              context: CheckContext = _EMPTY) -> bool:  # fmt: skip
    """Whether ``text`` is certainly clean at ``checkpoint``: no filter of ``chain`` fires with
    the detectors' fast layers, and no slow layer (the classifier, the model-based alignment
    check) would have been consulted. ``True`` means :func:`check` with the same inputs
    returns ``allow`` with no finding; ``False`` means "ask the full check" (not "unsafe").

    What for: the orchestrator moves a run on without waiting for the guardrails handler's
    verdict on a text it pre-screened clean (the verdict is still recorded, after the fact).
    """
    verdict = check(chain, checkpoint, text, replace(context, fast=True))
    return not verdict.fired
