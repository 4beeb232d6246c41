"""Routing quality and speed on tests/data/routing (126 labelled requests over 5 agents).

- accuracy of the embedding route alone (the best-scoring agent, whatever its score), and of
  the full embedding decision with the file's threshold and margin: how many it routes, how
  many of those are right, and the fallback rate (what would go to the model / the default);
- a sweep of the threshold, to show the accuracy / fallback trade-off;
- route p50/p95 per request (one task embedded, uncached, plus the scoring).

Usage: python bench/routing_eval.py [--agents PATH] [--requests PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import machine, pct

from nanocrab.memory import MiniLMEmbedder
from nanocrab.routing import Router, load_agents

DATA = Path(__file__).parent.parent / "tests" / "data" / "routing"


def main(args: argparse.Namespace) -> None:
    config = load_agents(args.agents)
    requests = [json.loads(line) for line in args.requests.read_text().splitlines() if line]
    embedder = MiniLMEmbedder()  # uncached: every request is embedded for real
    t0 = time.perf_counter()
    router = Router(config, embedder)
    setup_s = time.perf_counter() - t0
    for r in requests[:5]:
        router.by_embedding(r["text"])  # warm up
    times, top_ok, routed, routed_ok = [], 0, 0, 0
    scores = []
    confusions: dict[str, int] = {}
    for r in requests:
        t = time.perf_counter()
        d = router.by_embedding(r["text"])
        times.append((time.perf_counter() - t) * 1000)
        best = next(iter(d.scores))
        top_ok += best == r["agent"]
        if best != r["agent"]:
            key = f"{r['agent']}->{best}"
            confusions[key] = confusions.get(key, 0) + 1
        if d.method == "embedding":
            routed += 1
            routed_ok += d.agent == r["agent"]
        ranked = list(d.scores.values())
        scores.append((best == r["agent"], ranked[0], ranked[0] - ranked[1]))
    n = len(requests)
    print(machine())
    print(
        f"{n} requests over {len(config.agents)} agents; agents' texts embedded in "
        f"{setup_s * 1000:.0f} ms"
    )
    print(f"embedding route alone (best agent): accuracy {top_ok / n:.1%} ({top_ok}/{n})")
    print(
        f"with threshold {config.threshold} and margin {config.margin}: routed {routed}/{n}, "
        f"accuracy of routed {routed_ok / max(routed, 1):.1%}, fallback rate "
        f"{(n - routed) / n:.1%}"
    )
    print(f"route p50 {pct(times, 50):.2f} ms, p95 {pct(times, 95):.2f} ms (one text, uncached)")
    print("threshold sweep (margin as configured): threshold, fallback rate, accuracy of routed")
    for th in (0.0, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25):
        kept = [ok for ok, s, m in scores if s >= th and m >= config.margin]
        print(f"  {th:.2f}  {1 - len(kept) / n:6.1%}  {sum(kept) / max(len(kept), 1):6.1%}")
    if confusions:
        print("confusions:", ", ".join(f"{k} x{v}" for k, v in sorted(confusions.items())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=Path, default=DATA / "agents.yaml")
    parser.add_argument("--requests", type=Path, default=DATA / "requests.jsonl")
    main(parser.parse_args())
