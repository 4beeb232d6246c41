"""The HTTP gateway: tasks accepted per second, its overhead per task over publishing on NATS
directly, and 200 concurrent SSE/WebSocket subscribers following live runs with no lost events.

Part 1 (throughput, overhead): ``nanocrab gateway`` alone in its own process on a fresh data dir
(its embedded nats-server; no handlers, so nothing else competes for the 2 cores). Each task is
``POST /v1/tasks`` on a keep-alive connection (a minimal raw HTTP/1.1 client, so the figure is
the gateway's, not a client library's) vs the same ``task.submitted`` appended from this process
as the ``gateway`` identity (``append_traced``, what the gateway itself calls). Both sides without
trace export (NANOCRAB_TRACES=none). Overhead = p50(HTTP) - p50(NATS), sequential requests.

Part 2 (subscribers): ``nanocrab up`` serving the gateway, the offline model, the default
policy, no guardrails chain. R runs each stop at a Guarded call; S subscribers (half SSE, half
WebSocket) follow them from the start; once every subscriber has seen its run's
``approval.requested``, every call is approved over HTTP and each subscriber must end with
exactly its run's log sequence numbers up to the terminal event (compared with
``GET /v1/runs/{id}``) — no gap, no repeat.

Usage: python bench/gateway.py [--tasks 2000] [--concurrency 32] [--subscribers 200] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
import httpx
import websockets
from _common import machine, pct, summary_ms

from nanocrab.bus import BusConfig, append_traced
from nanocrab.bus.server import free_port
from nanocrab.cli.host import bus_session
from nanocrab.events import TaskSubmitted, new_event_id

NANOCRAB = [sys.executable, "-m", "nanocrab"]
SCRIPT = """
scripts:
  - name: write-note
    match: "note"
    turns:
      - text: "Writing the note you asked for into a file of the workspace, as asked."
        tool_calls:
          - {name: write, input: {path: "note.txt", content: "benchmark"}}
      - text: "Wrote the note."
  - name: echo
    turns:
      - text: "(offline model) I received your task: {task}"
"""


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANOCRAB_", "ANTHROPIC_"))}
    return {**env, "NANOCRAB_HOME": str(home), "NANOCRAB_TRACES": "none", **extra}


def token(home: Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        [*NANOCRAB, "gateway", "token", "create", "bench", "--scope", "admin", "--rate",
         "1000000/second", "--json"], env=env, cwd=home.parent, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    secret: str = json.loads(out.stdout)["token"]
    return secret


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], cwd: Path, ready: str) -> Iterator[None]:
    proc = subprocess.Popen(args, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if ready not in line:
            why = proc.stderr.read() if proc.stderr else ""
            raise SystemExit(f"{args} did not start: {line}{why}")
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


class Raw:
    """A keep-alive HTTP/1.1 connection that sends prepared requests and reads the answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, path: str, body: bytes, secret: str) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def part1(tmp: Path, tasks: int, concurrency: int) -> None:
    home = tmp / "p1" / "home"
    home.parent.mkdir(parents=True)
    port = free_port()
    env = env_for(home)
    with process([*NANOCRAB, "gateway", "--port", str(port)], env, home.parent, "nanocrab gateway"):
        secret = token(home, env)
        body = json.dumps({"text": "benchmark task"}).encode()
        async with bus_session(BusConfig(data_dir=home), name="bench", identity="gateway") as (
            log, _,
        ):  # fmt: skip
            conn = await Raw.open(port)
            for _ in range(200):  # warm-up: connections, code paths, the server's caches
                status, _ = await conn.post("/v1/tasks", body, secret)
                assert status == 202, status
                await append_traced(log, _task())
            http: list[float] = []
            direct: list[float] = []
            for _ in range(tasks):  # interleaved, so both see the same log size and load
                t0 = time.perf_counter()
                status, _ = await conn.post("/v1/tasks", body, secret)
                t1 = time.perf_counter()
                await append_traced(log, _task())
                t2 = time.perf_counter()
                assert status == 202, status
                http.append(t1 - t0)
                direct.append(t2 - t1)
            conn.close()
        print(f"  POST /v1/tasks, sequential ({tasks}): {summary_ms(http)}")
        print(f"  append on NATS directly ({tasks}):   {summary_ms(direct)}")
        over = pct(http, 50) - pct(direct, 50)
        print(f"  gateway overhead per task, p50: {over * 1000:.3f} ms (target <= 2 ms)")

        conns = [await Raw.open(port) for _ in range(concurrency)]
        per = tasks // concurrency

        async def worker(c: Raw) -> None:
            for _ in range(per):
                status, _ = await c.post("/v1/tasks", body, secret)
                assert status == 202, status

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.perf_counter() - t0
        for c in conns:
            c.close()
        print(f"  throughput: {per * concurrency / elapsed:.0f} tasks/s over HTTP "
              f"({concurrency} keep-alive connections, {per * concurrency} tasks)")  # fmt: skip


def _until_end(timeline: list[dict[str, Any]]) -> list[int]:
    """The run's log sequence numbers up to its terminal event, where a feed ends (the policy
    revokes the run's grants just after it: the run's log goes on, its feed does not)."""
    seqs = []
    for t in timeline:
        seqs.append(t["seq"])
        if t["type"] in ("run.completed", "run.failed", "run.cancelled"):
            break
    return seqs


def _task() -> TaskSubmitted:
    rid = new_event_id()
    return TaskSubmitted(text="benchmark task", run_id=rid, task_id=rid, session_id=rid,
                         source="gateway")  # fmt: skip


async def part2(tmp: Path, subscribers: int, runs: int) -> None:
    home = tmp / "p2" / "home"
    home.parent.mkdir(parents=True)
    script = tmp / "script.yaml"
    script.write_text(SCRIPT)
    port = free_port()
    # no guardrails chain: the fan-out measured here is the same whatever the chain decides,
    # and a chain that blocks a task would leave its subscribers nothing to wait for
    env = env_for(home, NANOCRAB_SCRIPT=str(script), NANOCRAB_GATEWAY=f"127.0.0.1:{port}",
                  NANOCRAB_GUARDRAILS="none")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with process([*NANOCRAB, "up"], env, home.parent, "nanocrab up"):
        secret = token(home, env)
        headers = {"Authorization": f"Bearer {secret}"}
        limits = httpx.Limits(max_connections=subscribers + 20)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                                     limits=limits) as c:  # fmt: skip
            ids = []
            for i in range(runs):
                r = await c.post("/v1/tasks", json={"text": f"please write a note {i}"})
                ids.append(r.json()["run_id"])
            seen_waiting = [0]
            all_waiting = asyncio.Event()

            def saw_request() -> None:
                seen_waiting[0] += 1
                if seen_waiting[0] == subscribers:
                    all_waiting.set()

            async def sse(run_id: str) -> list[int]:
                seqs: list[int] = []
                async with c.stream("GET", f"/v1/runs/{run_id}/events?deltas=false") as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            seqs.append(event["seq"])
                            if event["type"] == "approval.requested":
                                saw_request()
                return seqs

            async def ws(run_id: str) -> list[int]:
                seqs: list[int] = []
                address = f"ws://127.0.0.1:{port}/v1/runs/{run_id}/ws?deltas=false&token={secret}"
                async with websockets.connect(address, max_queue=None) as sock:
                    async for frame in sock:
                        item = json.loads(frame)
                        seqs.append(item["event"]["seq"])
                        if item["type"] == "approval.requested":
                            saw_request()
                return seqs

            plan = [(ids[i % runs], sse if i % 2 == 0 else ws) for i in range(subscribers)]
            t0 = time.perf_counter()
            followers = [asyncio.create_task(kind(rid)) for rid, kind in plan]
            await asyncio.wait_for(all_waiting.wait(), 120)
            connected = time.perf_counter() - t0
            approved = 0
            for rid in ids:
                while True:
                    pending = (await c.get("/v1/approvals")).json()["approvals"]
                    mine = [a for a in pending if a["run_id"] == rid]
                    if mine:
                        break
                    await asyncio.sleep(0.05)
                r = await c.post(f"/v1/approvals/{mine[0]['approval_id']}/approve", json={})
                approved += r.status_code == 200
            results = await asyncio.wait_for(asyncio.gather(*followers), 300)
            finished = time.perf_counter() - t0
            truth = {rid: _until_end((await c.get(f"/v1/runs/{rid}")).json()["timeline"])
                     for rid in ids}  # fmt: skip
        complete = sum(seqs == truth[rid] for (rid, _), seqs in zip(plan, results, strict=True))
        events = sum(len(s) for s in results)
        half = subscribers // 2
        print(f"  {subscribers} subscribers ({half} SSE + {subscribers - half} WebSocket) on "
              f"{runs} live runs: all following after {connected:.2f} s; {approved}/{runs} "
              f"approved over HTTP; runs done after {finished:.2f} s")  # fmt: skip
        print(f"  complete sequences: {complete}/{subscribers} ({events} events delivered, "
              f"none lost or repeated: {complete == subscribers})")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="nanocrab-bench-gateway-") as tmp:
        print("part 1: nanocrab gateway alone (no handlers)")
        await part1(Path(tmp), args.tasks, args.concurrency)
        print("part 2: nanocrab up with the gateway")
        await part2(Path(tmp), args.subscribers, args.runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
