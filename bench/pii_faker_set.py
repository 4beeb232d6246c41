"""Writes ``tests/data/guardrails/pii_faker.jsonl``: presidio-evaluator's sentence templates
filled with Faker's values — a PII set whose sentences and values we did not write.

presidio-evaluator (Microsoft, MIT licence) ships the templates Presidio's own evaluation
fills (``data_generator/raw_data/templates.txt``: "I have lost my card {{credit_card_number}}.
Could you please block my credit card ASAP? My name is {{person}}."). This script fills the
ones that hold an entity our PII detector covers — card, phone, e-mail, IBAN, US SSN (a
national id), IP address — with values from Faker in seven locales (``LOCALES``: phone
numbers, IBANs and SSN-like numbers in their local formats), the other placeholders (names,
addresses, companies) with Faker's too, and labels the spans of the covered ones. E-mails are
Faker's free-mail ones: its default uses the reserved ``example.*`` domains, which the detector
deliberately scores as not personal (test addresses, the fixtures of coding work). Templates
with none of them, filled the same way, are the negative samples. ``PER_TYPE`` sentences per
entity type (seeded).

The file is committed; to write it again, in an environment with Faker and the
presidio-evaluator wheel at hand: ``pip download presidio-evaluator==0.3.2 --no-deps -d /tmp/pe
&& pip install faker && python bench/pii_faker_set.py
/tmp/pe/presidio_evaluator-0.3.2-py3-none-any.whl``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

from _labelled import write_jsonl

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "guardrails"
OUT = DATA / "pii_faker.jsonl"
TEMPLATES = "presidio_evaluator/data_generator/raw_data/templates.txt"
LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL")
COVERED = {"credit_card_number": "card", "phone_number": "phone", "email": "email",
           "iban": "iban", "ssn": "national_id", "ip_address": "ip"}  # fmt: skip
PER_TYPE = 60
NEGATIVES = 60
_START, _END = datetime(1950, 1, 1), datetime(2025, 1, 1)
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_US: Any = None  # Faker("en_US"), set in main: the fallback for slots a locale lacks


def _value(fake: Any, slot: str, rng: random.Random) -> str:
    """Faker's value for a template slot (presidio-evaluator's names where Faker's differ)."""
    special = {
        # Faker's email() uses the reserved example.* domains, which the detector treats as
        # not personal (RFC 2606 test addresses, the fixtures of coding work): free-mail ones
        "email": fake.free_email,
        "person": fake.name, "name": fake.name, "name_female": fake.name_female,
        "name_male": fake.name_male, "first_name_nonbinary": fake.first_name,
        "address": lambda: fake.address().replace("\n", ", "),
        "organization": fake.company, "ip_address": lambda: rng.choice((fake.ipv4_public,
                                                                       fake.ipv6))(),
        "date_of_birth": lambda: fake.date_between(_START, _END).strftime("%B %d, %Y"),
        "nationality": fake.country, "nation_woman": fake.country, "nation_plural": fake.country,
        "us_driver_license": lambda: fake.bothify("?#######").upper(),
        "age": lambda: str(rng.randint(18, 90)), "year": lambda: str(rng.randint(1950, 2024)),
        # between fixed dates: Faker's defaults end at "now", and the file would change with it
        "date_time": lambda: fake.date_time_between(_START, _END).strftime("%Y-%m-%d %H:%M"),
        "day_of_week": fake.day_of_week, "zipcode": fake.postcode,
        "state_abbr": lambda: fake.bothify("??").upper(),
    }  # fmt: skip
    if slot in special:
        return str(special[slot]())
    try:
        return str(getattr(fake, slot)())
    except AttributeError:  # not in this locale's providers
        return str(getattr(_US, slot)())


def _fill(template: str, fake: Any, rng: random.Random) -> tuple[str, list[dict[str, Any]]]:
    out: list[str] = []
    entities: list[dict[str, Any]] = []
    pos = 0
    length = 0
    for m in _SLOT.finditer(template):
        literal = template[pos : m.start()]
        out.append(literal)
        length += len(literal)
        slot = m.group(1)
        # a US SSN in every locale: the covered national id
        value = _US.ssn() if slot == "ssn" else _value(fake, slot, rng)
        if slot in COVERED:
            entities.append({"type": COVERED[slot], "start": length, "end": length + len(value)})
        out.append(value)
        length += len(value)
        pos = m.end()
    out.append(template[pos:])
    return "".join(out), entities


def main() -> None:
    from faker import Faker

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path, help="presidio-evaluator's wheel")
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # a few of Faker's providers draw from sets
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    with zipfile.ZipFile(args.wheel) as wheel:
        lines = wheel.read(TEMPLATES).decode("utf-8", "replace").splitlines()
    # one template per line, its line breaks written as the escape \n (presidio-evaluator
    # reads them back as line breaks)
    templates = [t.strip().replace("\\n", "\n") for t in lines if t.strip()]
    global _US
    Faker.seed(2026)
    _US = Faker("en_US")
    rng = random.Random(2026)
    fakes = [Faker(locale) for locale in LOCALES]
    rows: list[dict[str, Any]] = []
    for slot, kind in COVERED.items():
        holding = [t for t in templates if "{{" + slot + "}}" in t]
        for i in range(PER_TYPE):
            fake = fakes[i % len(fakes)]
            text, entities = _fill(rng.choice(holding), fake, rng)
            rows.append({"text": text, "entities": entities, "split": "faker",
                         "source": f"{kind}/{LOCALES[i % len(LOCALES)]}"})  # fmt: skip
    plain = [t for t in templates if not any("{{" + s + "}}" in t for s in COVERED)]
    for i in range(NEGATIVES):
        fake = fakes[i % len(fakes)]
        text, _ = _fill(rng.choice(plain), fake, rng)
        rows.append({"text": text, "entities": [], "split": "faker",
                     "source": f"negative/{LOCALES[i % len(LOCALES)]}"})  # fmt: skip
    write_jsonl(OUT, rows)
    print(f"wrote {OUT.name}: {len(rows)} sentences")


if __name__ == "__main__":
    main()
