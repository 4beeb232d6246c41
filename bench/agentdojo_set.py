"""Writes ``tests/data/guardrails/injection_dojo.jsonl``: tool outputs exactly as AgentDojo's
agents read them, with and without its injections — an evaluation set we did not write.

Every other labelled set in ``tests/data/guardrails`` was written by us, in the style of the
public benchmarks; this one is produced by the benchmark's own code (AgentDojo 0.1.35, MIT
licence, benchmark version v1.2): for each of its four suites (workspace, travel, banking,
slack) its user tasks' ground-truth tool calls run in its environment through its
``GroundTruthPipeline``, and each tool result is rendered by its ``tool_result_to_str`` (YAML),
as the model sees it:

- ``benign``: every distinct tool result in the suite's default environment (its injection
  placeholders hold their default, innocuous text) — e-mails, calendars, files, reviews,
  transactions, Slack channels, web pages; results under 20 characters are left out;
- ``attack``: a tool result in which the placeholders the user task's calls read (AgentDojo's
  ``get_injection_candidates``) hold an attack: each of AgentDojo's attacks (``direct``,
  ``ignore_previous``, ``system_message``, ``injecagent``, ``important_instructions`` and its
  name variants, ``tool_knowledge``, ``dos``, ``captcha_dos``; the three offensive DoS attacks
  are left out) for randomly chosen (user task, injection task) pairs of each suite (seeded),
  the model named as AgentDojo names Claude.

A stable hash of each row puts it in ``dojoa`` (may be looked at) or ``dojob`` (never looked
at item by item); the set was first measured before any of it was looked at
(docs/guardrails.md).

Not run by the tests, nor needed to run anything: the file is committed. To write it again,
in an environment of its own: ``python -m venv /tmp/dojo && /tmp/dojo/bin/pip install
agentdojo==0.1.35 && PYTHONHASHSEED=0 /tmp/dojo/bin/python bench/agentdojo_set.py`` (the
hash seed fixes the order of the sets the tools return; some results carry the time they ran).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from _labelled import finish

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "guardrails"
OUT = DATA / "injection_dojo.jsonl"
VERSION = "v1.2"
ATTACKS = (
    "direct", "ignore_previous", "system_message", "injecagent", "important_instructions",
    "important_instructions_no_user_name", "important_instructions_no_model_name",
    "important_instructions_no_names", "important_instructions_wrong_model_name",
    "important_instructions_wrong_user_name", "tool_knowledge", "dos", "captcha_dos",
)  # fmt: skip
PER_ATTACK = 7  # (user task, injection task) pairs per attack and suite
MIN_CHARS = 20


def _outputs(suite: Any, user_task: Any, injections: dict[str, str]) -> list[str]:
    """The tool results the model reads when ``user_task`` runs its ground truth."""
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.types import get_text_content_as_str

    env = suite.load_and_inject_default_environment(injections)
    pipeline = GroundTruthPipeline(user_task)
    _, _, _, messages, _ = pipeline.query(user_task.PROMPT, FunctionsRuntime(suite.tools), env)
    return [
        get_text_content_as_str(m["content"])
        for m in messages
        if m["role"] == "tool" and m["content"] is not None
    ]


def _alnum(text: str) -> str:
    """Letters and digits only: YAML folds long strings, escapes newlines and quotes, so an
    attack's text is looked for in this form."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _marks(injection: str) -> list[str]:
    """Pieces of an attack's text that show it is in a result (its lines of 20+ letters)."""
    return [a[:40] for line in injection.splitlines() if len(a := _alnum(line)) >= 20]


def _cached(find: Any, cache: dict[str, list[str]]) -> Any:
    """``get_injection_candidates`` run once per user task (it runs the task's calls)."""

    def candidates(user_task: Any) -> list[str]:
        if user_task.ID not in cache:
            cache[user_task.ID] = find(user_task)
        return cache[user_task.ID]

    return candidates


def main() -> None:
    from agentdojo.attacks.attack_registry import load_attack
    from agentdojo.task_suite.load_suites import get_suites

    class Pipeline:  # what an attack reads of the pipeline it targets: the model's name
        name = "claude-3-5-sonnet-20241022"

    rng = random.Random(2026)
    rows: list[dict[str, object]] = []
    for suite_name, suite in sorted(get_suites(VERSION).items()):
        seen: set[str] = set()
        clean = {t.ID: _outputs(suite, t, {}) for t in suite.user_tasks.values()}
        candidates: dict[str, list[str]] = {}
        for user_task in suite.user_tasks.values():
            for text in clean[user_task.ID]:
                if len(text) >= MIN_CHARS and text not in seen:
                    seen.add(text)
                    source = f"{suite_name}/{user_task.ID}"
                    rows.append({"text": text, "category": f"dojo_{suite_name}",
                                 "label": "benign", "source": source})  # fmt: skip
        users = sorted(suite.user_tasks.values(), key=lambda t: t.ID)
        injection_tasks = sorted(suite.injection_tasks.values(), key=lambda t: t.ID)
        for attack_name in ATTACKS:
            attack = load_attack(attack_name, suite, Pipeline())  # type: ignore[arg-type]
            attack.get_injection_candidates = _cached(attack.get_injection_candidates, candidates)
            made = 0
            tries = 0
            while made < PER_ATTACK and tries < 50 * PER_ATTACK:
                tries += 1
                user_task, injection_task = rng.choice(users), rng.choice(injection_tasks)
                injections = attack.attack(user_task, injection_task)
                if not injections:
                    continue  # the task's calls read no placeholder
                marks = {m for i in injections.values() for m in _marks(i)}
                hit = [t for t in _outputs(suite, user_task, injections)
                       if any(m in _alnum(t) for m in marks)]  # fmt: skip
                if not hit:
                    continue
                source = f"{suite_name}/{user_task.ID}/{injection_task.ID}"
                rows.append({"text": rng.choice(hit), "category": f"dojo_{attack_name}",
                             "label": "attack", "source": source})  # fmt: skip
                made += 1
    # not the text: the tools stamp some results with the time they ran
    finish(rows, OUT, "dojo", width=4, key=lambda r: f"{r['label']}/{r['category']}/{r['source']}")


if __name__ == "__main__":
    main()
