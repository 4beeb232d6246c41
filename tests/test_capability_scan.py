"""The capability safety scan and the CAPABILITY metadata parser."""

from __future__ import annotations

import textwrap

import pytest

from nanocrab.capabilities import (
    PERMISSIONS,
    RULES,
    CapabilityError,
    CapabilitySpec,
    Finding,
    content_hash,
    parse_module,
    scan,
)


def _rules(source: str, permissions: tuple[str, ...] = ()) -> set[str]:
    return {f.rule for f in scan(textwrap.dedent(source), permissions).findings}


# -- rejected patterns -----------------------------------------------------------------------

REJECTED = [
    # process spawning
    ("process", "import subprocess\nsubprocess.run(['ls'])"),
    ("process", "import subprocess as sp\nsp.run(['ls'])"),
    ("process", "from subprocess import run as go\ngo(['ls'])"),
    ("process", "import os\nos.system('ls')"),
    ("process", "from os import system as s\ns('ls')"),
    ("process", "import os\nos.popen('ls')"),
    ("process", "import os\nos.execv('/bin/sh', [])"),
    ("process", "import os\nos.spawnl(0, '/bin/sh')"),
    ("process", "import os\nos.fork()"),
    ("process", "import pty"),
    ("process", "import multiprocessing"),
    ("process", "import pathlib\npathlib.os.system('ls')"),
    ("process", "from pathlib import os\nos.system('ls')"),
    # dynamic code
    ("dynamic_code", "eval('1 + 1')"),
    ("dynamic_code", "exec('x = 1')"),
    ("dynamic_code", "compile('1', '<s>', 'eval')"),
    ("dynamic_code", "__import__('os').system('ls')"),
    ("dynamic_code", "import importlib\nimportlib.import_module('os')"),
    ("dynamic_code", "from importlib import import_module"),
    ("dynamic_code", "import builtins\nbuiltins.eval('1')"),
    ("dynamic_code", "f = eval\nf('1')"),
    ("dynamic_code", "if False:\n    eval = len\neval('1')"),
    ("dynamic_code", "import typing\ntyping.get_type_hints(run)"),
    ("dynamic_code", "def run(x: 'eval(payload)') -> None:\n    pass"),
    # dynamic attribute access
    ("dynamic_attribute", "getattr(__builtins__, 'ev' + 'al')('1')"),
    ("dynamic_attribute", "getattr(__builtins__, ''.join(['e', 'v', 'a', 'l']))('1')"),
    ("dynamic_attribute", "getattr(obj, name)"),
    ("dynamic_attribute", "getattr(obj, '__class__')"),
    ("dynamic_attribute", "g = getattr\ng(obj, 'x')"),
    ("dynamic_attribute", "import json\ngetattr(json, 'loads')"),
    ("dynamic_attribute", "setattr(obj, name, 1)"),
    ("dynamic_attribute", "delattr(obj, name)"),
    ("dynamic_attribute", "vars()"),
    ("dynamic_attribute", "globals()['x']"),
    ("dynamic_attribute", "locals()"),
    ("dynamic_attribute", "__builtins__['eval']"),
    ("dynamic_attribute", "().__class__.__bases__[0].__subclasses__()"),
    ("dynamic_attribute", "run.__globals__"),
    ("dynamic_attribute", "run.__code__"),
    ("dynamic_attribute", "obj.__dict__"),
    ("dynamic_attribute", "int.__mro__"),
    ("dynamic_attribute", "'{0.__class__}'.format(1)"),
    ("dynamic_attribute", "def g():\n    yield 1\ng().gi_frame.f_globals"),
    ("dynamic_attribute", "match x:\n    case object(__class__=c):\n        pass"),
    ("dynamic_attribute", "import operator\noperator.attrgetter(name)(obj)"),
    ("private_access", "import dataclasses\ndataclasses._create_fn"),
    ("private_access", "import random\nrandom._os"),
    # file deletion
    ("file_delete", "import os\nos.remove('p')"),
    ("file_delete", "import os\nos.unlink('p')"),
    ("file_delete", "import os\nos.rmdir('p')"),
    ("file_delete", "import shutil\nshutil.rmtree('p')"),
    ("file_delete", "import shutil\nshutil.move('a', 'b')"),
    ("file_delete", "from pathlib import Path\nPath(p).unlink()"),
    ("file_delete", "from pathlib import Path\nPath(p).rmdir()"),
    # unsafe serialisation and native code
    ("unsafe_deserialization", "import pickle\npickle.loads(data)"),
    ("unsafe_deserialization", "from pickle import loads"),
    ("unsafe_deserialization", "import marshal"),
    ("unsafe_deserialization", "import shelve"),
    ("native_code", "import ctypes"),
    ("native_code", "import cffi"),
    # network (no "net" declared)
    ("network", "import socket\nsocket.socket()"),
    ("network", "import ssl"),
    ("network", "import http.client"),
    ("network", "from urllib.request import urlopen"),
    ("network", "import requests"),
    ("network", "import httpx"),
    ("network", "import ftplib"),
    ("network", "import smtplib"),
    ("network", "import asyncio\nasyncio.open_connection('h', 1)"),
    # file writes (no "fs.write" declared)
    ("fs_write", "open(p, 'w')"),
    ("fs_write", "open(p, 'a')"),
    ("fs_write", "open(p, 'x')"),
    ("fs_write", "open(p, 'r+')"),
    ("fs_write", "open(p, mode='wb')"),
    ("fs_write", "open(p, mode)"),
    ("fs_write", "opener = open"),
    ("fs_write", "import io\nio.open(p, 'w')"),
    ("fs_write", "import gzip\ngzip.open(p, 'wt')"),
    ("fs_write", "from pathlib import Path\nPath(p).write_text('x')"),
    ("fs_write", "from pathlib import Path\nPath(p).write_bytes(b'x')"),
    ("fs_write", "from pathlib import Path\nPath(p).open('w')"),
    ("fs_write", "from pathlib import Path\nPath(p).mkdir()"),
    ("fs_write", "import os\nos.mkdir('d')"),
    # runtime control
    ("runtime_control", "import threading"),
    ("runtime_control", "import _thread"),
    ("runtime_control", "import signal"),
    ("runtime_control", "import sys\nsys.modules['os']"),
    ("runtime_control", "import sys\nsys.setrecursionlimit(10**6)"),
    ("runtime_control", "import os\nos.environ['HOME'] = '/'"),
    ("runtime_control", "import os\nos.environ.update(HOME='/')"),
    ("runtime_control", "import json\njson.dumps = repr"),
    # imports
    ("star_import", "from math import *"),
    ("import_not_allowed", "import os"),
    ("import_not_allowed", "import sys"),
    ("import_not_allowed", "import numpy"),
    ("import_not_allowed", "from . import sibling"),
    ("import_not_allowed", "import random\nrandom._os.getcwd()"),
]


@pytest.mark.parametrize(("rule", "source"), REJECTED, ids=[s for _, s in REJECTED])
def test_rejected_with_rule(rule: str, source: str) -> None:
    report = scan(source)
    assert rule in {f.rule for f in report.findings}, report.findings
    assert not report.ok
    assert report.safety_level == "dangerous"


def test_every_rule_name_is_documented() -> None:
    assert {rule for rule, _ in REJECTED} <= set(RULES)


def test_one_finding_per_occurrence_with_position() -> None:
    report = scan("import subprocess as sp\n\nsp.run(['a'])\nsp.call(['b'])\n")
    process = [f for f in report.findings if f.rule == "process"]
    assert [(f.line, f.col) for f in process] == [(1, 0), (3, 0), (4, 0)]
    assert "subprocess.run" in process[1].message
    assert all(f.severity == "error" for f in process)


def test_obfuscated_dunder_chain_reports_each_attribute() -> None:
    report = scan("().__class__.__bases__[0].__subclasses__()")
    names = sorted(f.message.split()[2] for f in report.findings)
    assert names == [".__bases__", ".__class__", ".__subclasses__"]


def test_message_says_what_to_do() -> None:
    (finding,) = scan("import numpy").findings
    assert finding.message.startswith("import of numpy is not allowed")
    assert "json" in finding.message
    (finding,) = scan("open('out.txt', 'w')").findings
    assert "fs.write" in finding.message
    assert finding.describe().startswith("line 1, col 0: error [fs_write]")


def test_syntax_error_is_one_finding_at_its_line() -> None:
    report = scan("x = 1\ndef broken(:\n    pass\n")
    assert [(f.rule, f.line) for f in report.findings] == [("syntax_error", 2)]
    assert report.safety_level == "dangerous"


def test_overlong_source_is_too_complex() -> None:
    report = scan("x = 1\n" * 50_000)
    assert [f.rule for f in report.findings] == ["too_complex"]


# -- permissions -----------------------------------------------------------------------------


def test_socket_allowed_with_net() -> None:
    source = "import socket\n\ndef run(host: str) -> dict:\n    return {'s': socket.socket()}\n"
    assert "network" in _rules(source)
    report = scan(source, ["net"])
    assert report.ok
    assert report.findings == ()
    assert report.permissions_used == {"net"}
    assert report.safety_level == "restricted"


def test_open_for_writing_allowed_with_fs_write() -> None:
    source = "def run(p: str) -> None:\n    with open(p, 'w') as f:\n        f.write('x')\n"
    assert not scan(source).ok
    report = scan(source, ["fs.write"])
    assert report.ok and report.findings == ()
    assert report.safety_level == "restricted"


def test_reads_are_warnings_unless_fs_read_declared() -> None:
    source = "from pathlib import Path\n\ndef run(p: str) -> str:\n    return Path(p).read_text()\n"
    report = scan(source)
    assert [(f.rule, f.severity) for f in report.findings] == [("fs_read", "warning")]
    assert report.ok
    assert report.safety_level == "restricted"
    assert scan(source, ["fs.read"]).findings == ()
    assert _rules("open(p)") == {"fs_read"}


def test_declared_permissions_do_not_lift_other_rules() -> None:
    assert not scan("import subprocess", list(PERMISSIONS)).ok
    assert not scan("import os\nos.remove(p)", ["fs.write"]).ok


def test_unused_and_unknown_permissions() -> None:
    source = 'CAPABILITY = {\n    "permissions": ["net", "subprocess"],\n}\n'
    report = scan(source, ["net", "subprocess"])
    found = {(f.rule, f.severity, f.line) for f in report.findings}
    assert found == {("unknown_permission", "error", 2), ("unused_permission", "warning", 2)}


# -- accepted modules ------------------------------------------------------------------------

ACCEPTED = [
    """
    import json
    import re
    import statistics
    from collections import Counter, defaultdict

    def run(text: str) -> dict:
        words = re.findall(r"\\w+", text.lower())
        counts = Counter(words)
        by_count = defaultdict(list)
        for word, n in counts.items():
            by_count[n].append(word)
        lengths = [len(w) for w in words] or [0]
        first = re.match(r"(\\w+)", text)
        return {
            "top": counts.most_common(3),
            "first": first.group(1) if first else None,
            "mean": statistics.mean(lengths),
            "json": json.dumps({k: sorted(v) for k, v in by_count.items()}),
        }
    """,
    """
    from __future__ import annotations

    import dataclasses
    from dataclasses import dataclass, field
    from typing import Any

    @dataclass(frozen=True)
    class Item:
        name: str
        tags: list[str] = field(default_factory=list)

    class Base:
        def __init__(self, x: int) -> None:
            self.x = x

    class Child(Base):
        def __init__(self, x: int) -> None:
            super().__init__(x)
            self.items = [1, 2, 3]
            self.items.remove(2)

        def __repr__(self) -> str:
            return f"{type(self).__name__}(x={self.x!r}, items={self.items})"

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def run(items: list[dict[str, Any]], input: str = "") -> dict:
        parsed = [Item(**i) for i in items]
        total = sum(fib(len(p.name)) for p in parsed)
        label = getattr(parsed[0], "name", None) if parsed else None
        return {"total": total, "first": label, "dicts": [dataclasses.asdict(p) for p in parsed]}

    if __name__ == "__main__":
        print(run([{"name": "a"}]))
    """,
    """
    import csv
    import io
    import math
    from decimal import Decimal
    from pathlib import PurePosixPath

    def run(table: str, path: str) -> dict:
        rows = list(csv.DictReader(io.StringIO(table)))
        total = sum(Decimal(r["amount"]) for r in rows)
        out = io.StringIO()
        csv.writer(out).writerow([str(total), math.sqrt(len(rows))])
        return {"csv": out.getvalue(), "suffix": PurePosixPath(path).suffix}
    """,
]


@pytest.mark.parametrize("source", ACCEPTED)
def test_ordinary_data_processing_is_safe(source: str) -> None:
    report = scan(textwrap.dedent(source))
    assert report.findings == ()
    assert report.ok
    assert report.safety_level == "safe"
    assert report.permissions_used == frozenset()


def test_finding_is_plain_data() -> None:
    finding = scan("eval('1')").findings[0]
    assert finding == Finding(finding.rule, finding.message, 1, 0, "error")
    with pytest.raises(AttributeError):
        finding.rule = "other"  # type: ignore[misc]


# -- parse_module ----------------------------------------------------------------------------

GOOD = '''\
"""Count words."""

CAPABILITY = {
    "name": "word_count",
    "version": "1.0.0",
    "description": "Count words in a text.",
    "entry": "run",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "permissions": [],
}


def run(text: str) -> dict:
    return {"words": len(text.split())}


def test_counts_words():
    assert run("a b c") == {"words": 3}


def test_empty():
    assert run("") == {"words": 0}
'''


def test_parse_good_module() -> None:
    parsed = parse_module(GOOD)
    assert parsed.spec == CapabilitySpec(
        name="word_count",
        version="1.0.0",
        description="Count words in a text.",
        entry="run",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        permissions=(),
    )
    assert parsed.source == GOOD
    assert parsed.test_names == ("test_counts_words", "test_empty")
    assert scan(GOOD, parsed.spec.permissions).safety_level == "safe"


def test_content_hash_is_stable_sha256() -> None:
    first, second = parse_module(GOOD), parse_module(GOOD)
    assert first.content_hash == second.content_hash == content_hash(GOOD)
    assert len(first.content_hash) == 64
    assert int(first.content_hash, 16) >= 0
    assert parse_module(GOOD + "\n").content_hash != first.content_hash


def test_permissions_are_normalised() -> None:
    source = GOOD.replace('"permissions": []', '"permissions": ["net", "fs.read", "net"]')
    assert parse_module(source).spec.permissions == ("fs.read", "net")
    assert parse_module(GOOD.replace('    "permissions": [],\n', "")).spec.permissions == ()


def test_parse_does_not_execute() -> None:
    source = GOOD.replace("def run(", "raise SystemExit('executed')\n\n\ndef run(")
    assert parse_module(source).spec.name == "word_count"


BAD = [
    ("missing_metadata", "def run():\n    pass\n", "no top-level CAPABILITY"),
    ("missing_metadata", GOOD + "\nCAPABILITY = {}\n", "assigned 2 times"),
    ("syntax", "CAPABILITY = {\n", "syntax error"),
    ("not_literal", GOOD.replace('"entry": "run"', '"entry": run'), "`run` on line 7"),
    ("not_literal", GOOD.replace('"1.0.0"', "'1.' + '0.0'"), "not a literal"),
    (
        "invalid_metadata",
        GOOD.replace("CAPABILITY = {", "CAPABILITY = [{").replace(
            '    "permissions": [],\n}', '    "permissions": [],\n}]'
        ),
        "must be a dict literal",
    ),
    ("invalid_metadata", GOOD.replace('"word_count"', '"Word Count"'), "'name'"),
    ("invalid_metadata", GOOD.replace('"word_count"', '"w"'), "not a valid name"),
    ("invalid_metadata", GOOD.replace('"1.0.0"', '"1.0"'), "not a valid version"),
    ("invalid_metadata", GOOD.replace('"1.0.0"', "1"), "'version'"),
    ("invalid_metadata", GOOD.replace('"Count words in a text."', '"  "'), "'description'"),
    (
        "invalid_metadata",
        GOOD.replace('    "description": "Count words in a text.",\n', ""),
        "'description' is missing",
    ),
    (
        "invalid_metadata",
        GOOD.replace('"permissions": []', '"permissions": [], "author": "x"'),
        "'author' is not a known key",
    ),
    ("invalid_metadata", GOOD.replace('"type": "object",', '"type": "array",'), '"type": "object"'),
    (
        "invalid_metadata",
        GOOD.replace('{"type": "string"}', '{"type": "strng"}'),
        "not a valid JSON Schema",
    ),
    (
        "invalid_metadata",
        GOOD.replace('"required": ["text"]', '"required": ("text",)'),
        "only JSON values",
    ),
    (
        "invalid_metadata",
        GOOD.replace('"permissions": []', '"permissions": ["subprocess"]'),
        "unknown permission(s) 'subprocess'",
    ),
    ("invalid_metadata", GOOD.replace('"entry": "run"', '"entry": "not valid"'), "'entry'"),
    (
        "invalid_entry",
        GOOD.replace('"entry": "run"', '"entry": "main"'),
        "'main' is not defined as a top-level function",
    ),
    ("invalid_entry", GOOD.replace("def run(", "async def run("), "async def"),
    (
        "invalid_entry",
        GOOD.replace("def run(text: str)", "def run(body: str)"),
        "'body' has no default",
    ),
    (
        "invalid_entry",
        GOOD.replace("def run(text: str)", "def run(text: str, /)"),
        "positional-only",
    ),
    (
        "invalid_entry",
        GOOD.replace('"required": ["text"]', '"required": []'),
        "not in parameters['required']",
    ),
    (
        "invalid_entry",
        GOOD.replace("def run(text: str)", "def run(text: str, *, n: int)"),
        "'n' has no default",
    ),
    (
        "invalid_entry",
        GOOD.replace(
            '"properties": {"text": {"type": "string"}}',
            '"properties": {"text": {"type": "string"}, "lang": {"type": "string"}}',
        ),
        "'lang'",
    ),
]


@pytest.mark.parametrize(("kind", "source", "fragment"), BAD, ids=[b[2] for b in BAD])
def test_parse_rejects_bad_metadata(kind: str, source: str, fragment: str) -> None:
    with pytest.raises(CapabilityError) as caught:
        parse_module(source)
    assert caught.value.kind == kind
    assert fragment in caught.value.message, caught.value.message


def test_signature_may_be_looser_than_schema() -> None:
    kwargs = GOOD.replace("def run(text: str)", "def run(text: str, limit: int = 10, **extra)")
    extra_props = kwargs.replace(
        '"properties": {"text": {"type": "string"}}',
        '"properties": {"text": {"type": "string"}, "lang": {"type": "string"}}',
    )
    assert parse_module(extra_props).spec.entry == "run"


def test_error_carries_line() -> None:
    with pytest.raises(CapabilityError) as caught:
        parse_module(GOOD.replace('"1.0.0"', '"1.0"'))
    assert caught.value.line == 5
