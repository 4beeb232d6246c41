"""Audit: for every tool call, what was asked, what was granted, who approved, what ran, how it
ended; every human approval; every refused forgery.

Tables: ``audit_invocations`` (one row per call: ``(run_id, call_id)``), ``audit_approvals`` (one
per ``(run_id, approval_id)``), ``audit_violations`` (one per ``security.rejected``) and
``audit_revocations`` (grant revocations by ``(run_id, grant_id)``, kept so a revocation that
names only its grant still marks the call once the grant is seen), and ``audit_applied_events``
(the ids of the events folded in, so a second copy of one, which the log may hold, changes
nothing).

Call ids come from the model provider (Anthropic's ``toolu_…``, the scripted model, a user's own
provider), which may number them per run; the policy derives approval and grant ids from them.
So every id is read within its event's run, and two runs never share a row.

The events of one call may come in any order (a revocation before its grant, a completion for a
call never requested). Rows therefore hold *facts* (times, ids, flags, the list of answers an
approval received) and the derived columns — ``status``, ``approval_required``,
``approval_result``, ``approver`` — are recomputed from those facts whenever a row is written.
An event about an unknown call creates the row with what it says. Approvals: the first answer
(granted, denied or expired) that no ``security.rejected`` refused wins; later ones change
nothing.

A batch is applied in three steps: load the rows it touches (by run and call, grant or approval),
fold its events into them in log order, then replace those rows (delete + insert by key). Plain
Core statements, identical on SQLite and PostgreSQL; since the fold depends only on the log,
a rebuild gives the same rows whatever the batch boundaries.
"""

from nanocrab.projections.audit.budgets import BudgetRow, audit_budgets, budget_stops
from nanocrab.projections.audit.fold import AuditProjection
from nanocrab.projections.audit.queries import (
    ApprovalRow,
    AuditRow,
    ViolationRow,
    approval_row,
    audit_rows,
    pending_approvals,
    violations,
)
from nanocrab.projections.audit.tables import (
    STATUSES,
    audit_approvals,
    audit_events,
    audit_invocations,
    audit_revocations,
    audit_violations,
)

__all__ = [
    "STATUSES",
    "ApprovalRow",
    "AuditProjection",
    "AuditRow",
    "BudgetRow",
    "ViolationRow",
    "approval_row",
    "audit_approvals",
    "audit_budgets",
    "audit_events",
    "audit_invocations",
    "audit_revocations",
    "audit_rows",
    "audit_violations",
    "budget_stops",
    "pending_approvals",
    "violations",
]
