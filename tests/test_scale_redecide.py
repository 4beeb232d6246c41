"""A decision re-made after part of it landed still lands whole (found on a cluster).

When the leader of the log stream dies, appends get "no responders" until the survivors elect a
new one. An orchestrator decision of several events lands one event at a time; if the stream
fails between them, the cause is redelivered and decided again, and the new decision holds only
what is missing. Its ordinals restart at 0, so its first event was derived the id of the event
that already landed: JetStream's de-duplication took it for a copy and the run never completed
(tests/test_scale_failover.py found runs stuck after ``reply.sent``). ``append_reaction`` now
shifts past an id that belongs to another stored event.
"""

from __future__ import annotations

from nanocrab.bus import EventLog, Expect, Reaction, read_run
from nanocrab.bus.reactions import append_reaction, stamp
from nanocrab.cli.agent import new_task
from nanocrab.events import ReplySent, RunCompleted


async def test_a_decision_remade_after_its_first_event_landed_appends_the_rest(
    log: EventLog,
) -> None:
    cause = new_task("hello", "default", None)
    scope = log.subjects.run(cause.run_id)
    submitted = await log.append(cause)
    decision = [ReplySent(text="hi"), RunCompleted(reply="hi", steps=1)]
    original = stamp("orchestrator", cause, decision)
    # the first event of the decision landed; the stream failed before the second
    landed = await log.append(original[0], expect=Expect(submitted.seq, scope))

    remade = Reaction(decision[1:], expect=Expect(landed.seq, scope), chained=True)
    assert await append_reaction(log, "orchestrator", cause, remade)

    stored = [s.event for s in await read_run(log, cause.run_id)]
    assert [e.type for e in stored if e] == ["task.submitted", "reply.sent", "run.completed"]
    completed = stored[-1]
    assert completed is not None and completed.id == original[1].id  # as first decided
    # the same re-made decision once more (another redelivery): the run has moved past its
    # expectation, so it is superseded and nothing more is stored
    again = Reaction(decision[1:], expect=Expect(landed.seq, scope), chained=True)
    assert await append_reaction(log, "orchestrator", cause, again) is False
    assert len(await read_run(log, cause.run_id)) == 3
