"""The registry believes people for enabling, and the generator only for what is new.

An adversarial pass (7), as ``capgen``, enabled capabilities of its own and registered other
code under an enabled name, which stayed enabled. Now ``capability.enabled`` is a person's
(``cli``) alone, the generator's ``capability.auto_enabled`` counts only for a capability
nobody has decided on since it was registered, an enabling counts only for the current
version, and other code under an enabled name waits for a person — in the registry projection
and in the generator's own fold of the log alike."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.bus.permissions import may_publish
from nanocrab.events import CapabilityAutoEnabled, CapabilityDisabled, CapabilityEnabled
from nanocrab.handlers.capgen import CapgenHandler
from nanocrab.projections.capabilities import capability
from nanocrab.sandbox import Sandbox

from .test_capgen import (
    V2_PASSING,
    WORD_COUNT_V1,
    block,
    generate,
    project,
    provider,
    sandbox,  # noqa: F401 (the session's sandbox fixture)
)

OTHER = WORD_COUNT_V1.replace('"name": "word_count"', '"name": "other_count"')


def test_only_people_may_publish_an_enabling() -> None:
    assert may_publish("cli", "capability.enabled")
    assert not may_publish("capgen", "capability.enabled")
    assert may_publish("capgen", "capability.auto_enabled")


async def test_an_enabling_counts_for_the_current_code_and_the_generator_for_new_ones_only(
    log: EventLog, sandbox: Sandbox, sqlite_engine: AsyncEngine  # noqa: F811
) -> None:
    engine = sqlite_engine
    handler = CapgenHandler(log, sandbox=sandbox, provider=provider(
        {"first": [block(WORD_COUNT_V1)], "good v2": [block(V2_PASSING)],
         "other": [block(OTHER)]}
    ))  # fmt: skip

    async def status(name: str) -> tuple[str, str]:
        await project(log, engine)
        detail = await capability(engine, name)
        assert detail is not None
        folded = (await handler.registry())[name]
        assert folded.enabled == (detail.row.status == "enabled"), "the generator's fold agrees"
        return detail.row.status, detail.row.status_reason

    await generate(log, handler, "first", name="word_count")
    await log.append(CapabilityEnabled(name="word_count", version="0.1.0", source="cli"))
    assert (await status("word_count"))[0] == "enabled"

    # other code under the enabled name: disabled until a person enables that code
    await generate(log, handler, "good v2", name="word_count")
    state, why = await status("word_count")
    assert state == "disabled" and why.startswith("new version")
    await log.append(CapabilityAutoEnabled(name="word_count", version="0.2.0",
                                           reason="auto_enable", source="capgen"))  # fmt: skip
    assert (await status("word_count"))[0] == "disabled", "not new: the generator cannot"
    await log.append(CapabilityEnabled(name="word_count", version="0.1.0", source="cli"))
    assert (await status("word_count"))[0] == "disabled", "an enabling of the code before"
    await log.append(CapabilityEnabled(name="word_count", version="0.2.0", source="cli"))
    assert (await status("word_count"))[0] == "enabled"

    # a new capability: the generator's enabling counts, once; a person's disabling stands
    await generate(log, handler, "other", name="other_count")
    assert (await status("other_count"))[0] == "disabled"
    auto = CapabilityAutoEnabled(name="other_count", version="0.1.0", reason="auto_enable",
                                 source="capgen")  # fmt: skip
    await log.append(auto)
    assert (await status("other_count"))[0] == "enabled"
    await log.append(CapabilityDisabled(name="other_count", version="0.1.0", reason="no"))
    await log.append(CapabilityAutoEnabled(name="other_count", version="0.1.0",
                                           reason="auto_enable", source="capgen"))  # fmt: skip
    assert (await status("other_count")) == ("disabled", "no")
