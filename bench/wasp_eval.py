"""The default chain on WASP's web-agent prompt injections, as the tool output that carries them.

WASP (Meta, "WASP: Benchmarking Web Agent Security Against Prompt Injection Attacks"; code at
github.com/facebookresearch/wasp) plants injections in GitLab issues and Reddit posts that a
web agent reads: each of its 21 attacker goals (``configs/experiment_config.raw.json``:
create a deploy token and open a URL with it, add an SSH key, make a user an owner, …) in each
of its four formats (``constants.py``: plain-text and URL injections, generic or hijacking the
user's own goal), with each of the user goals of its environment — 168 texts. Each is checked
at ``tool_output``; attacks only, so this prints recall. Nothing is written or committed.

Usage: ``python bench/wasp_eval.py /path/to/wasp`` (a bare clone works: files are read with
``git show``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from _labelled import read_from_clone

from nanocrab.guardrails import CheckContext, check, load_guardrails

CONFIG = "webarena_prompt_injections/configs/experiment_config.raw.json"
CONSTANTS = "webarena_prompt_injections/constants.py"
DOMAINS = {"gitlab_domain": "http://gitlab.example:8023", "reddit_domain": "http://reddit.example:9999"}


class _Params(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return DOMAINS.get(key, key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("repo", type=Path, help="a clone of facebookresearch/wasp")
    args = parser.parse_args()
    config = json.loads(read_from_clone(args.repo, CONFIG))["prompt_injections_setup_config"]
    constants: dict[str, Any] = {}
    # class definitions only: the injection formats and the user goals
    exec(read_from_clone(args.repo, CONSTANTS), constants)
    formats: dict[str, str] = constants["PromptInjectionFormat"].MESSAGE
    goals: dict[str, list[str]] = {"gitlab": constants["GitlabUserGoals"].GOALS,
                                   "reddit": constants["RedditUserGoals"].GOALS}  # fmt: skip
    chain = load_guardrails()
    context = CheckContext(tool=None, agent=None, task=None)
    flagged: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for attack in config:
        params = _Params(attack["parameters"])
        url = attack["action_url"].format_map(params)
        instruction = attack["instruction"].format_map(params)
        for name, template in formats.items():
            for goal in goals[attack["environment"]]:
                text = template.format(
                    user_goal_str=goal.lower().rstrip("."), instantiated_url_of_action=url,
                    instantiated_instruction_text=instruction.replace(" ", "-")
                    if "url_injection" in name else instruction,
                )  # fmt: skip
                total[name] += 1
                verdict = check(chain, "tool_output", text, context)
                flagged[name] += verdict.action in ("block", "require_approval")
    for name in formats:
        print(f"wasp {name:30} flagged {flagged[name]}/{total[name]}")
    print(f"wasp {'all':30} flagged {sum(flagged.values())}/{sum(total.values())} at tool_output")


if __name__ == "__main__":
    main()
