"""The executor's credentials, looked up by name: a secret never leaves this module in clear
except into the connection that needs it.

A connector's configuration names its credential (``password: work-mail``); the value comes from

1. the environment variable ``NANOCRAB_CREDENTIAL_<NAME>`` (the name upper-cased, ``-`` and
   ``.`` as ``_``: ``NANOCRAB_CREDENTIAL_WORK_MAIL``), else
2. the credentials file (``<config dir>/credentials.yaml``, a YAML mapping ``name: value``) —
   refused when group or others may read it.

Both are read when a call needs the value (a rotated password applies to the next call). What
comes back is a :class:`Secret`, whose ``repr``/``str`` never show the value: a secret formatted
into a message, a log line or an event by mistake reads ``***``.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from pathlib import Path

from nanocrab.yamlfile import read_yaml

ENV_PREFIX = "NANOCRAB_CREDENTIAL_"
CREDENTIAL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


class CredentialError(Exception):
    """A credential that cannot be had; the message names it (never its value) and what to fix."""


class _Unreadable(Exception):
    pass


class Secret:
    """A credential's value. Only :meth:`reveal` gives it; every other view is ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of the value replaced by ``***`` (for messages that
        echo what a server was sent)."""
        return text.replace(self._value, "***") if self._value else text

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def env_name(name: str) -> str:
    """The environment variable holding credential ``name``."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


class Credentials:
    """Credentials by name, from ``environ`` then ``file`` (see the module docstring)."""

    def __init__(self, *, file: Path | None, environ: Mapping[str, str]) -> None:
        self.file = file
        self._environ = environ

    def get(self, name: str) -> Secret:
        """The value of credential ``name``; :class:`CredentialError` when it is not set, or the
        file is unreadable, malformed or readable by others."""
        value = self._environ.get(env_name(name))
        if value is not None:
            return Secret(value)
        stored = self._from_file().get(name)
        if stored is None:
            where = f" or add it to {self.file}" if self.file is not None else ""
            raise CredentialError(
                f"credential {name!r} is not set: set {env_name(name)} in the executor's "
                f"environment{where}"
            )
        return Secret(stored)

    def _from_file(self) -> dict[str, str]:
        if self.file is None or not self.file.exists():
            return {}
        try:
            mode = self.file.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise CredentialError(
                    f"{self.file}: group or others may access it; run chmod 600 {self.file}"
                )
            text = self.file.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"{self.file}: cannot read the credentials file: {exc}") from exc
        try:
            data, _ = read_yaml(text, str(self.file), _Unreadable, what="credentials files")
        except _Unreadable:  # the parser's message may quote the file: say only where
            raise CredentialError(
                f"{self.file}: not valid YAML; a credentials file maps names to strings"
            ) from None
        if data is None:
            return {}
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in data.items()
        ):
            raise CredentialError(f"{self.file}: a credentials file maps names to strings")
        return {k: str(v) for k, v in data.items()}
