"""The capability generator: guidance in, a scanned and sandbox-tested version registered out.

Consumes ``capability.requested``. For up to ``max_attempts`` attempts it asks the model for a
module, extracts the one ```python block, vets it statically (parse, name, version, JSON
Schema, the AST scanner) and runs each of its ``test_*`` functions in the WASM sandbox. Every
attempt is on the record as it happens: ``capability.generated`` (the code, whenever there was
a code block) and ``capability.tested`` (findings and test results); a refused attempt's
findings and failing tests go back to the model verbatim. The attempt that passes ends the
request with ``capability.tested(passed, final)`` + ``capability.registered`` — the only event
that moves the registry, so a new version replaces the old one only once its tests pass. When
the attempts are spent the last ``capability.tested(final)`` says so and nothing is registered.

Settings (``capability_config``, :mod:`nanocrab.capabilities.config`): the model and its
``max_tokens``, the attempts cap, the size, test and registry limits, the test sandbox's limits,
the permitted operations (a module declaring another is refused, ``permission_forbidden``), and
``auto_enable``: a capability new to the registry is then enabled at once
(``capability.auto_enabled``, reason ``auto_enable``) when everything it ``requires`` is enabled.
A module's ``requires`` must name registered, not removed capabilities and form no cycle. The
registry entry carries ``user_guidance``: the module's, else the request's guidance.

Redelivery: a request that already has a final verdict in the log (looked up after the
request's own position) emits nothing; otherwise it starts over and the progress events, whose
ids derive from (capgen, request id, attempt), deduplicate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace as dc_replace

from msgspec.structs import replace
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from nanocrab.bus import Delivery, EventLog, stamp
from nanocrab.bus.direct import DirectReader
from nanocrab.capabilities import CapabilityError, parse_module
from nanocrab.capabilities.config import CapabilityConfig
from nanocrab.capabilities.deps import Node, problems
from nanocrab.capabilities.module import MAX_GUIDANCE_CHARS
from nanocrab.events import (
    CapabilityAutoEnabled,
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityFinding,
    CapabilityGenerated,
    CapabilityRegistered,
    CapabilityRemoved,
    CapabilityRequested,
    CapabilityTested,
    Event,
    EventDecodeError,
)
from nanocrab.handlers.capgen import prompt
from nanocrab.handlers.capgen.checks import StaticVerdict, check_module
from nanocrab.handlers.capgen.sandboxed import (
    FILE_PERMISSIONS,
    TEST_LIMITS,
    ModuleTests,
    run_tests,
)
from nanocrab.llm.base import LlmError, Message, ModelRequest, Provider
from nanocrab.sandbox import Limits, Sandbox, SandboxError

NAME = "capgen"
_PROGRESS_ORDINAL = 10_000  # attempt n: generated at +10n, a refused verdict at +10n+1
MAX_ATTEMPTS = 10


class CapgenHandler:
    name = NAME
    consumes: tuple[type[Event], ...] = (CapabilityRequested,)
    concurrency = 4  # requests are independent; each spends most of its time on the model

    def __init__(
        self,
        log: EventLog,
        *,
        provider: Provider,
        sandbox: Sandbox,
        model: str = "",
        test_limits: Limits | None = None,
        llm_attempts: int = 3,
        backoff_s: float = 1.0,
        config: CapabilityConfig | None = None,
    ) -> None:
        """``config``: the ``capability_config`` settings (defaults without); its ``model``,
        when set, wins over ``model``, and ``test_limits`` over its test limits."""
        self.log = log
        self.provider = provider
        self.sandbox = sandbox
        self.config = config or CapabilityConfig()
        self.model = self.config.model or model
        if test_limits is None:
            test_limits = self.config.limits.tests() if config is not None else TEST_LIMITS
        self.test_limits = test_limits
        self.llm_attempts = llm_attempts
        self.backoff_s = backoff_s
        self.reader = DirectReader(log.nc, log.cfg.log_stream, leader_only=not log.direct)

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        assert isinstance(event, CapabilityRequested)
        if await self._decided(event, delivery.seq):
            return []
        attempts = max(1, min(event.max_attempts, MAX_ATTEMPTS, self.config.max_attempts))
        current = (await self._versions(event.name))[1] if event.name else None
        messages = [
            prompt.user(prompt.first_request(event.guidance, name=event.name, current=current))
        ]
        for attempt in range(1, attempts + 1):
            try:
                reply, model = await self._ask(event, messages, attempt)
            except LlmError as exc:
                message = f"the model failed ({exc.kind}): {exc.message}"
                return [self._failed(event, attempt, "model_failed", message)]
            messages.append(prompt.assistant(reply))
            try:
                tested, verdict = await self._attempt(event, reply, attempt, model)
            except SandboxError as exc:  # the host cannot run the sandbox: retrying cannot help
                return [self._failed(event, attempt, "sandbox_unavailable", str(exc))]
            if tested.passed:
                registered = self._registered(verdict, attempt, event.guidance)
                out: list[Event] = [replace(tested, final=True), registered]
                if self.config.auto_enable:
                    out.extend(await self._auto_enabled(registered))
                return out
            if attempt == attempts:
                return [replace(tested, final=True, report=_gave_up(tested, attempts))]
            await self._progress(event, tested, attempt, 1)
            messages.append(prompt.user(prompt.feedback(attempt, tested.findings, tested.tests)))
        raise AssertionError("unreachable: the last attempt returns")

    async def _attempt(
        self, event: CapabilityRequested, reply: str, attempt: int, model: str
    ) -> tuple[CapabilityTested, StaticVerdict]:
        """Vet one answer; appends its ``capability.generated`` (when it holds code) at once and
        returns the verdict for the caller to append or return."""
        code = prompt.extract_code(reply)
        if code is None:
            finding = CapabilityFinding(
                rule="no_code_block", message="the answer holds no ```python code block"
            )
            verdict = StaticVerdict(content_hash="", findings=[finding])
            return self._tested(event, attempt, verdict, None), verdict
        name = event.name or declared_name(code)
        registered, current = await self._versions(name) if name else ({}, None)
        verdict = check_module(
            code, name=event.name, registered=registered, current=current, config=self.config,
            registry=await self.registry(),
        )  # fmt: skip
        generated = CapabilityGenerated(
            name=name or verdict.name,
            version=verdict.version,
            attempt=attempt,
            code=code,
            content_hash=verdict.content_hash,
            model=model,
        )
        await self._progress(event, generated, attempt, 0)
        run = None
        if verdict.ok:
            assert verdict.module is not None
            scratch = bool(FILE_PERMISSIONS & set(verdict.module.spec.permissions))
            run = await run_tests(
                self.sandbox, code, verdict.module.test_names,
                limits=self.test_limits, scratch=scratch,
            )  # fmt: skip
        return self._tested(event, attempt, verdict, run), verdict

    async def _ask(
        self, event: CapabilityRequested, messages: list[Message], attempt: int
    ) -> tuple[str, str]:
        request = ModelRequest(
            system=prompt.system_prompt(self.config.permitted),
            messages=list(messages),
            model=self.model,
            max_tokens=self.config.max_tokens,
            run_id=event.id,
            turn=attempt - 1,
            task=event.guidance,
        )
        async for retry in AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, LlmError) and e.kind == "retryable"),
            stop=stop_after_attempt(self.llm_attempts),
            wait=wait_exponential(multiplier=self.backoff_s, max=20.0),
            reraise=True,
        ):
            with retry:
                response = await self.provider.complete(request)
        return prompt.response_text(response), response.model or request.model

    async def _decided(self, event: CapabilityRequested, seq: int) -> bool:
        """Whether the log already holds this request's final verdict (a redelivery)."""
        scope = self.log.subjects.of_type("capability.tested")
        for raw in await self.reader.after(scope, seq):
            try:
                stored = self.log.decode(raw.data, subject=raw.subject)
            except EventDecodeError:
                continue
            if (
                isinstance(stored, CapabilityTested)
                and stored.final
                and stored.causation_id == event.id
            ):
                return True
        return False

    async def _versions(self, name: str) -> tuple[dict[str, str], str | None]:
        """The capability's registered versions (version → content hash) and its current one."""
        scope = self.log.subjects.capability(name).removesuffix(">") + "capability.registered"
        versions: dict[str, str] = {}
        current = None
        for raw in await self.reader.after(scope, 0):
            try:
                stored = self.log.decode(raw.data, subject=raw.subject)
            except EventDecodeError:
                continue
            if isinstance(stored, CapabilityRegistered) and stored.name == name:
                versions[stored.version] = stored.content_hash
                current = stored.version
        return versions, current

    async def registry(self) -> dict[str, Node]:
        """Every capability ever registered, by name, as the log says now."""
        return await registry_from_log(self.log, self.reader)

    async def _auto_enabled(self, registered: CapabilityRegistered) -> list[Event]:
        """``auto_enable``: the ``capability.auto_enabled`` of a capability new to the registry, if
        everything it requires is enabled; nothing for a new version (it keeps its status)."""
        nodes = await self.registry()
        before = nodes.get(registered.name)
        if before is not None and not before.removed:
            return []
        nodes[registered.name] = Node(enabled=False, requires=tuple(registered.requires))
        if problems(nodes, registered.name):
            return []
        return [
            CapabilityAutoEnabled(
                name=registered.name, version=registered.version,
                requires=list(registered.requires), reason="auto_enable",
            )
        ]  # fmt: skip

    async def _progress(self, cause: Event, event: Event, attempt: int, slot: int) -> None:
        first = _PROGRESS_ORDINAL + 10 * attempt + slot
        await self.log.append(stamp(self.name, cause, [event], first=first)[0])

    def _tested(
        self,
        event: CapabilityRequested,
        attempt: int,
        verdict: StaticVerdict,
        run: ModuleTests | None,
    ) -> CapabilityTested:
        passed = verdict.ok and run is not None and run.passed
        findings = list(verdict.findings) + (run.findings if run else [])
        return CapabilityTested(
            name=event.name or verdict.name,  # a wrong name stays under the requested one
            version=verdict.version,
            attempt=attempt,
            passed=passed,
            content_hash=verdict.content_hash,
            safety_level=verdict.safety_level,
            findings=findings,
            tests=run.tests if run else [],
            sandbox_outcome=run.outcome if run else None,
            duration_ms=run.duration_ms if run else 0.0,
            report=_report(verdict, run, passed=passed),
        )

    @staticmethod
    def _registered(verdict: StaticVerdict, attempt: int, guidance: str) -> CapabilityRegistered:
        module = verdict.module
        assert module is not None and verdict.safety_level is not None
        spec = module.spec
        return CapabilityRegistered(
            name=spec.name,
            version=spec.version,
            content_hash=module.content_hash,
            safety_level=verdict.safety_level,
            description=spec.description,
            entry=spec.entry,
            parameters=dict(spec.parameters),
            permissions=list(spec.permissions),
            code=module.source,
            tests=list(module.test_names),
            attempt=attempt,
            user_guidance=spec.user_guidance or _clip(guidance.strip(), MAX_GUIDANCE_CHARS),
            requires=list(spec.requires),
        )

    @staticmethod
    def _failed(event: CapabilityRequested, attempt: int, rule: str, message: str) -> Event:
        """A request that cannot go on (the model or the sandbox failed): its final verdict."""
        return CapabilityTested(
            name=event.name,
            version="",
            attempt=attempt,
            passed=False,
            final=True,
            findings=[CapabilityFinding(rule=rule, message=message)],
            report=f"{message}; nothing was registered",
        )


def declared_name(code: str) -> str:
    """The name a module declares, or "" when it does not parse (the checks will say why)."""
    try:
        return parse_module(code).spec.name
    except CapabilityError:
        return ""


async def registry_from_log(log: EventLog, reader: DirectReader) -> dict[str, Node]:
    """Every capability ever registered, by name, folded from the log: enabled, removed, and
    the ``requires`` of its current version (what the registry projection would say, without
    waiting for it)."""
    raws = []
    for kind in ("registered", "enabled", "auto_enabled", "disabled", "removed"):
        raws.extend(await reader.after(log.subjects.of_type(f"capability.{kind}"), 0))
    nodes: dict[str, Node] = {}
    current: dict[str, tuple[str, str]] = {}  # name → (version, content hash)
    awaiting: set[str] = set()  # registered, and nobody enabled or disabled it since
    for raw in sorted(raws, key=lambda r: r.seq):
        try:
            e = log.decode(raw.data, subject=raw.subject)
        except EventDecodeError:
            continue
        if isinstance(e, CapabilityRegistered):  # as the projection (projections/capabilities)
            old = nodes.get(e.name)
            fresh = old is None or old.removed
            same = current.get(e.name, ("", ""))[1] == e.content_hash
            keep = not fresh and old is not None and old.enabled and same
            nodes[e.name] = Node(enabled=keep, requires=tuple(e.requires))
            current[e.name] = (e.version, e.content_hash)
            if fresh:
                awaiting.add(e.name)
            elif old is not None and old.enabled and not same:
                awaiting.discard(e.name)  # a new version of enabled code waits for a person
            continue
        node = nodes.get(getattr(e, "name", ""))
        if node is None or node.removed:
            continue
        if isinstance(e, CapabilityEnabled):
            version_ok = current.get(e.name, ("", ""))[0] == e.version
            auto_ok = not isinstance(e, CapabilityAutoEnabled) or (
                e.name in awaiting and not node.enabled
            )
            if version_ok and auto_ok:
                nodes[e.name] = dc_replace(node, enabled=True)
                awaiting.discard(e.name)
        elif isinstance(e, CapabilityDisabled):
            nodes[e.name] = dc_replace(node, enabled=False)
            awaiting.discard(e.name)
        elif isinstance(e, CapabilityRemoved):
            nodes[e.name] = dc_replace(node, enabled=False, removed=True)
    return nodes


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _report(verdict: StaticVerdict, run: ModuleTests | None, *, passed: bool) -> str:
    errors = sum(f.severity == "error" for f in verdict.findings)
    if errors:
        return f"the static checks found {errors} problem{'s' if errors > 1 else ''}"
    if run is None:
        return "not run"
    ok = sum(t.passed for t in run.tests)
    summary = f"tests {ok}/{len(run.tests)} passed in the sandbox ({run.duration_ms:.0f} ms)"
    if passed:
        return summary
    return f"{summary}; failing: " + ", ".join(t.name for t in run.tests if not t.passed)


def _gave_up(tested: CapabilityTested, attempts: int) -> str:
    return f"{tested.report}; gave up after {attempts} attempt(s): nothing was registered"
