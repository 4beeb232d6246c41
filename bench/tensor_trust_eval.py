"""The default chain on the Tensor Trust benchmarks' attacks, as tasks a user submits.

Tensor Trust (Toyer et al., "Tensor Trust: Interpretable Prompt Injection Attacks from an
Online Game"; data at github.com/HumanCompatibleAI/tensor-trust-data) collected attacks that
players wrote against each other's defence prompts; its two robustness benchmarks keep the ones
that beat strong defences: ``hijacking`` (make the model say "Access Granted") and
``extraction`` (make it reveal the access code). Each attack is checked at ``task_input``
(what a user types). Attacks only, so this prints recall; the false-positive side of
``task_input`` is the labelled sets' tasks (``bench/guardrails_eval.py``). Nothing is written
or committed: the data stays in its own repository (2.4 MB).

Usage: ``python bench/tensor_trust_eval.py /path/to/tensor-trust-data`` (a bare clone works:
files are read with ``git show``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _labelled import read_from_clone

from nanocrab.guardrails import CheckContext, check, load_guardrails

BENCHMARKS = {
    "hijacking": "benchmarks/hijacking-robustness/v1/hijacking_robustness_dataset.jsonl",
    "extraction": "benchmarks/extraction-robustness/v1/extraction_robustness_dataset.jsonl",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("repo", type=Path, help="a clone of tensor-trust-data")
    args = parser.parse_args()
    chain = load_guardrails()
    context = CheckContext(tool=None, agent=None, task=None)
    for name, path in BENCHMARKS.items():
        lines = read_from_clone(args.repo, path).splitlines()
        attacks = [json.loads(line)["attack"] for line in lines if line.strip()]
        flagged = sum(check(chain, "task_input", a, context).action in ("block", "require_approval")
                      for a in attacks)  # fmt: skip
        print(f"tensor trust {name:10} flagged {flagged}/{len(attacks)} "
              f"({100 * flagged / len(attacks):.1f} %) at task_input")


if __name__ == "__main__":
    main()
