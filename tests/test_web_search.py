"""web_search against a fake search API on loopback: the providers' HTTP shapes, the allow-list,
the policy on the provider's host, and a run through the bus with the scripted model."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import EventLog, read_run
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import TextBlock, ToolCompleted, WebSearchDetails
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.llm import ScriptedProvider
from nanocrab.policy import Policy, PolicyError
from nanocrab.policy.engine import Request, evaluate
from nanocrab.security import KeyRing, signed_by
from nanocrab.tools import (
    BraveSearch,
    HostAllowList,
    LocalOperations,
    TavilySearch,
    ToolContext,
    ToolRegistry,
    ToolResult,
    WebSearchTool,
    default_tools,
    make_search_provider,
)

from .agent_fixtures import finished, of_type, running_host, submit
from .test_tools_support import make_ctx

KEY = "sk-search-test-0123456789"


@dataclass
class FakeSearchApi:
    """A search API on 127.0.0.1 answering Brave's GET and Tavily's POST shapes; records what it
    was sent."""

    port: int = 0
    status: int = 200
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    @property
    def brave_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/res/v1/web/search"

    @property
    def tavily_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/search"


def _handler(api: FakeSearchApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def _answer(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(api.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            api.requests.append(("GET", url.path + "?" + url.query, dict(self.headers), b""))
            q = parse_qs(url.query)
            count = int(q["count"][0])
            results = [
                {
                    "title": f"Result {i} for {q['q'][0]}",
                    "url": f"https://docs.example.org/{i}",
                    "description": f"snippet {i}",
                }
                for i in range(1, 4)
            ] + [{"title": "Elsewhere", "url": "https://other.test/x", "description": "far"}]
            self._answer({"type": "search", "web": {"results": results[:count]}})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            api.requests.append(("POST", self.path, dict(self.headers), body))
            query = json.loads(body)
            self._answer(
                {"query": query["query"],
                 "results": [{"title": "T", "url": "https://docs.example.org/t",
                              "content": "tavily snippet", "score": 0.9}]}
            )  # fmt: skip

    return Handler


@pytest.fixture
def api() -> Iterator[FakeSearchApi]:
    state = FakeSearchApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def search(tool: WebSearchTool, ctx: ToolContext, **arguments: object) -> ToolResult:
    return await ToolRegistry([tool]).invoke("web_search", arguments, ctx)


async def test_brave_results_come_back_as_a_numbered_list(
    api: FakeSearchApi, ctx: ToolContext
) -> None:
    tool = WebSearchTool(
        BraveSearch(KEY, endpoint=api.brave_url), ["127.0.0.1", "docs.example.org"]
    )
    result = await search(tool, ctx, query="nats jetstream", count=4)
    assert not result.is_error, text_of(result)
    text = text_of(result)
    assert "1. Result 1 for nats jetstream\n   https://docs.example.org/1\n   snippet 1" in text
    assert "https://other.test/x [not fetchable: host not allowed]" in text
    assert "docs.example.org/1 [not" not in text
    assert result.details == WebSearchDetails(
        provider="brave", host="127.0.0.1", query="nats jetstream", results=4,
        urls=[*(f"https://docs.example.org/{i}" for i in range(1, 4)), "https://other.test/x"],
    )  # fmt: skip
    ((method, path, headers, _),) = api.requests
    assert method == "GET" and path.startswith("/res/v1/web/search?")
    assert parse_qs(urlsplit(path).query) == {"q": ["nats jetstream"], "count": ["4"]}
    assert headers["X-Subscription-Token"] == KEY
    assert KEY not in text and KEY not in repr(result) and KEY not in repr(tool.provider)


async def test_tavily_speaks_its_own_api(api: FakeSearchApi, ctx: ToolContext) -> None:
    tool = WebSearchTool(
        make_search_provider("tavily", KEY, endpoint=api.tavily_url), ["127.0.0.1"]
    )
    assert isinstance(tool.provider, TavilySearch)
    result = await search(tool, ctx, query="wasm sandbox")
    assert "1. T\n   https://docs.example.org/t [not fetchable" in text_of(result)
    assert "tavily snippet" in text_of(result)
    ((method, path, headers, body),) = api.requests
    assert (method, path) == ("POST", "/search")
    assert json.loads(body) == {"query": "wasm sandbox", "max_results": 5}
    assert headers["Authorization"] == f"Bearer {KEY}"


async def test_a_provider_host_off_the_allow_list_is_denied_without_a_request(
    api: FakeSearchApi, ctx: ToolContext
) -> None:
    tool = WebSearchTool(BraveSearch(KEY, endpoint=api.brave_url), ["docs.example.org"])
    result = await search(tool, ctx, query="anything")
    assert result.error_kind == "denied" and "'127.0.0.1'" in text_of(result)
    assert api.requests == []


async def test_a_grant_naming_other_hosts_keeps_the_search_from_running(
    api: FakeSearchApi, tmp_path: Path
) -> None:
    tool = WebSearchTool(BraveSearch(KEY, endpoint=api.brave_url), ["127.0.0.1"])
    ctx = make_ctx(tmp_path, allowed_hosts=HostAllowList(["docs.example.org"]))
    result = await search(tool, ctx, query="anything")
    assert result.error_kind == "denied" and "granted" in text_of(result)
    assert api.requests == []


async def test_an_api_error_is_a_failed_result_without_the_body(
    api: FakeSearchApi, ctx: ToolContext
) -> None:
    api.status = 429
    tool = WebSearchTool(BraveSearch(KEY, endpoint=api.brave_url), ["127.0.0.1"])
    result = await search(tool, ctx, query="anything")
    assert result.error_kind == "failed" and "HTTP 429" in text_of(result)


async def test_an_unreachable_provider_is_failed(ctx: ToolContext) -> None:
    with socket_closed_port() as port:
        endpoint = f"http://127.0.0.1:{port}/res/v1/web/search"
    tool = WebSearchTool(BraveSearch(KEY, endpoint=endpoint), ["127.0.0.1"])
    result = await search(tool, ctx, query="anything")
    assert result.error_kind == "failed" and "brave" in text_of(result)


class socket_closed_port:
    """A loopback port that was bound and released: nothing listens on it."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port: int = self.sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_an_unknown_provider_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="brave, tavily"):
        make_search_provider("bing", KEY)


def test_default_tools_add_web_search_only_with_a_provider() -> None:
    assert "web_search" not in [t.name for t in default_tools()]
    tools = default_tools(web_allow=["api.search.brave.com"], search=BraveSearch(KEY))
    (tool,) = [t for t in tools if isinstance(t, WebSearchTool)]
    assert tool.host == "api.search.brave.com" and tool.allow.allows("api.search.brave.com")


# --- the policy decides web_search on the provider's host, like web_fetch on the URL's --------

SEARCH_POLICY = Policy.from_mapping(
    {
        "version": 1,
        "rules": [
            {"id": "web", "tools": ["web_fetch", "web_search"], "hosts": ["127.0.0.1"],
             "tier": "safe"},
        ],
    },
    source="tests/test_web_search.py",
)  # fmt: skip


def _decide(tmp_path: Path, host: str | None) -> object:
    return evaluate(
        SEARCH_POLICY,
        Request(
            tool="web_search", arguments={"query": "x"}, workspace=tmp_path,
            known_tools=frozenset({"web_search", "web_fetch"}),
            tool_hosts={"web_search": host} if host else {},
        ),
    )  # fmt: skip


def test_the_policy_decides_web_search_on_the_provider_host(tmp_path: Path) -> None:
    allowed = _decide(tmp_path, "127.0.0.1")
    assert allowed.tier == "safe" and allowed.resource == "127.0.0.1"  # type: ignore[attr-defined]
    (cap,) = allowed.capabilities  # type: ignore[attr-defined]
    assert (cap.tool, cap.resource, cap.access) == ("web_search", "127.0.0.1", "network")
    assert _decide(tmp_path, "api.search.brave.com").tier == "deny"  # type: ignore[attr-defined]
    assert _decide(tmp_path, None).tier == "deny"  # type: ignore[attr-defined]


def test_a_hosts_rule_may_not_name_a_tool_without_a_host() -> None:
    with pytest.raises(PolicyError, match="web_fetch, web_search"):
        Policy.from_mapping(
            {"version": 1,
             "rules": [{"id": "x", "tools": ["read"], "hosts": ["a.test"], "tier": "safe"}]},
            source="t",
        )  # fmt: skip


# --- end to end: the scripted model searches through the bus ------------------------------------

SEARCHING = """
scripts:
  - name: search
    turns:
      - tool_calls: [{name: web_search, input: {query: "event sourcing", count: 2}}]
      - text: "Found it."
"""


async def test_a_run_searches_through_the_bus(
    log: EventLog,
    sqlite_engine: AsyncEngine,
    tmp_path: Path,
    api: FakeSearchApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as the wiring does when a search key is set: the default agent gets web_search
    base = agents.profile("default")
    with_search = base.model_copy(update={"tools": (*base.tools, "web_search")})
    monkeypatch.setitem(agents.PROFILES, "default", with_search)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    keys = KeyRing(tmp_path / "keys")
    policy_keys = frozenset({keys.public_key("policy")})
    tool = WebSearchTool(BraveSearch(KEY, endpoint=api.brave_url), ["127.0.0.1"])
    registry = ToolRegistry([*default_tools(), tool])
    provider = ScriptedProvider.from_text(SEARCHING)
    reactors = [
        Orchestrator(log, trust=signed_by(policy_keys)),
        PolicyHandler(log, policy=SEARCH_POLICY, keys=keys, known_tools=frozenset(registry.names()),
                      default_workspace=workspace, tool_hosts={"web_search": tool.host}),
        Executor(log, registry=registry, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(SEARCH_POLICY, keys)),
        LlmHandler(log, provider=provider, registry=registry, default_workspace=workspace),
    ]  # fmt: skip
    task = submit("look it up", workspace)
    async with running_host(log, sqlite_engine, reactors):
        await log.append(task)
        events = await finished(log, task.run_id)
    assert of_type(events, ToolCompleted), [(e.type, getattr(e, "reason", "")) for e in events]
    (done,) = of_type(events, ToolCompleted)
    assert not done.is_error, done.content
    assert isinstance(done.details, WebSearchDetails) and done.details.results == 2
    assert "Result 1 for event sourcing" in done.content[0].text
    assert len(api.requests) == 1
    stored = [s.event for s in await read_run(log, task.run_id) if s.event is not None]
    assert KEY.encode() not in b"".join(msgspec.json.encode(e) for e in stored)  # never logged
