"""The learned layer of the injection detector: a small neural head over sentence embeddings
from the project's own model (all-MiniLM-L6-v2, :mod:`nanocrab.memory.embedder`).

Why: the heuristics (:mod:`nanocrab.guardrails.injection`) match phrasings; an attack worded
in a way no rule foresaw ("drop whatever guidance you got", "note to any AI shopping
assistant: ...") passes them. An embedding carries the *kind* of sentence — an instruction
aimed at an assistant — across wordings, so a head trained on our own examples
(``bench/guardrails_trainset.py``, ``bench/guardrails_train.py``) generalises past the rules.

Cost decides where it runs: one forward pass costs ~12 ms for a short sentence and ~50 ms for
100 tokens on one core here, against a budget of 3 ms per check. So the classifier reads only
*windows*: a short text (``SHORT`` characters) whole when it addresses someone, directs or
names a secret; a longer one in at most ``MAX_WINDOWS`` sentence windows that hit two cue
groups (addressing an assistant, a directive, an action verb, a secret word). The detector
calls it only while the heuristics are below the filter's threshold. Code, logs and prose
without such a window cost nothing.

The weights (``injection_head.npz``, ~450 KB) hold five 384-64-1 ReLU networks whose
probabilities are averaged (a plain logistic regression was tried first: it could not tell a
request addressed to a person from one addressed to an assistant — on the dev set 5.7 % of
benign tool output scored over 0.8 against 2.4 % for one network), the embedding model's id
(a head is only valid for the model it was trained on) and a summary of the training run.
When the embedding model is not installed the classifier reports itself unavailable (logged
once) and the detector runs on heuristics alone.
"""

# ruff: noqa: RUF001  (full-width punctuation ends sentences in CJK text)

from __future__ import annotations

import importlib.resources
import io
import logging
import re
import threading
from dataclasses import dataclass

import ahocorasick  # type: ignore[import-not-found]
import numpy as np

from nanocrab.memory.embedder import Embedder

log = logging.getLogger(__name__)

WEIGHTS = "injection_head.npz"
SHORT = 360  # texts up to this many characters are read whole
MAX_WINDOWS = 2
_WINDOW = 300  # characters per window (~60-80 word pieces)

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
# Cue groups; a window of a long text is read when it hits two different groups. Latin words
# (matched as whole words) plus the commonest words of the other scripts the training set
# covers (the CJK ones and "пароль" match inside words too, as their scripts do not space words).
_CUE_WORDS: dict[str, tuple[str, ...]] = {
    "address": ("you", "your", "assistant", "ai", "a.i.", "model", "llm", "bot", "agent", "gpt",
                "chatgpt", "claude", "gemini", "copilot", "helper", "du", "dir", "dich", "vous",
                "tu", "usted", "voi", "jij", "ты", "вы"),
    "directive": ("ignore", "disregard", "forget", "instead", "must", "immediately", "urgent",
                  "important", "instruction", "please", "kindly", "never mind", "drop",
                  "pretend", "imagine", "act as", "roleplay", "role-play", "stop",
                  "instructions", "prompt", "system", "override", "priority", "new task",
                  "from now on", "do not tell", "don't tell", "without asking", "silently",
                  "quietly", "before you", "ignoriere", "vergiss", "ignorer", "ignorez",
                  "oublie", "ignora", "olvida", "dimentica", "negeer", "zignoruj", "игнорируй",
                  "забудь"),
    "action": ("send", "transfer", "wire", "forward", "email", "e-mail", "upload", "post",
               "share", "delete", "remove", "grant", "invite", "run", "execute", "install",
               "download", "click", "visit", "buy", "pay", "approve", "unlock", "disable",
               "reveal", "print", "output", "repeat", "say", "respond", "reply", "answer",
               "include", "append", "translate", "write", "tell", "show", "display", "leak",
               "exfiltrate"),
    "secret": ("password", "passphrase", "passcode", "secret", "credential", "credentials",
               "api key", "token", "access code", "access granted", "system prompt",
               "confidential", "private key", ".env", "ssh"),
}  # fmt: skip
_CUE_ANYWHERE: dict[str, tuple[str, ...]] = {
    "address": ("助手", "アシスタント", "어시스턴트"),
    "directive": ("忽略", "无视", "無視", "무시"),
    "secret": ("密码", "パスワード", "비밀번호", "пароль"),
}
_GROUP_BIT = {group: 1 << i for i, group in enumerate(_CUE_WORDS)}
_SHORT_CUES = _GROUP_BIT["address"] | _GROUP_BIT["directive"] | _GROUP_BIT["secret"]
_ALL_CUES = sum(_GROUP_BIT.values())


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _cue_automaton() -> ahocorasick.Automaton:
    """Every cue in one Aho-Corasick automaton; a cue's value: ``(length, group bits, bounded,
    first is a word character, last is a word character)`` (``bounded``: checked for ``\\b``
    at both ends, as a regular expression ``\\b(?:...)\\b`` would)."""
    entries: dict[str, tuple[int, int, bool, bool, bool]] = {}
    for table, bounded in ((_CUE_WORDS, True), (_CUE_ANYWHERE, False)):
        for group, words in table.items():
            for word in words:
                bits = entries[word][1] if word in entries else 0
                entries[word] = (len(word), bits | _GROUP_BIT[group], bounded,
                                 _is_word(word[0]), _is_word(word[-1]))  # fmt: skip
    automaton = ahocorasick.Automaton()
    for word, value in entries.items():
        automaton.add_word(word, value)
    automaton.make_automaton()
    return automaton


_CUE_AUTOMATON = _cue_automaton()


def cue_groups(text: str, enough: int = _ALL_CUES) -> int:
    """The cue groups ``text`` hits, as bits of ``_GROUP_BIT``, in one pass over the text
    (four alternation regexes took ~0.6 ms for the windows of a 4 KB source file); stops once
    every group in ``enough`` is found."""
    found = 0
    last = len(text) - 1
    for end, (length, bits, bounded, word_first, word_last) in _CUE_AUTOMATON.iter(text):
        if not bits & ~found:
            continue
        if bounded:
            start = end - length + 1
            if start > 0 and _is_word(text[start - 1]) == word_first:
                continue
            if start == 0 and not word_first:
                continue
            if end < last and _is_word(text[end + 1]) == word_last:
                continue
            if end == last and not word_last:
                continue
        found |= bits
        if found & enough == enough:
            break
    return found


def windows(text: str) -> list[str]:
    """The windows the classifier reads in ``text`` (already normalised): the whole text when
    short and it hits an ``address``, ``directive`` or ``secret`` cue, else up to
    ``MAX_WINDOWS`` sentence windows hitting two or more cue groups, the ones hitting most
    groups first."""
    if len(text) <= SHORT:
        # a short text is read whole, when it speaks to someone, directs or names a secret:
        # "what is in notes.txt?" costs nothing, "what's the password?" is read
        return [text] if cue_groups(text, _SHORT_CUES) & _SHORT_CUES else []
    sentences = [s for s in _SENTENCE.split(text) if s.strip()]
    scored: list[tuple[int, int, str]] = []
    i = 0
    while i < len(sentences):
        window = sentences[i].strip()
        j = i + 1
        while j < len(sentences) and len(window) + len(sentences[j]) < _WINDOW:
            window += " " + sentences[j].strip()
            j += 1
        window = window[:_WINDOW]
        groups = cue_groups(window).bit_count()
        if groups >= 2:
            scored.append((-groups, i, window))
        i = j
    scored.sort()
    return [w for _, _, w in scored[:MAX_WINDOWS]]


@dataclass(frozen=True, slots=True)
class Head:
    """A trained head on unit embeddings: the mean probability of ``k`` small networks with
    one hidden ReLU layer each, ``p_i = sigmoid(w2_i · relu(W1_iᵀx + b1_i) + b2_i)``
    (``w1`` is ``(k, dim, hidden)``; ``None`` for a plain logistic regression,
    ``p = sigmoid(w2 · x + b2)``)."""

    w1: np.ndarray | None
    b1: np.ndarray | None
    w2: np.ndarray
    b2: np.ndarray
    model_id: str

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        """One probability per row of ``vectors``."""
        if self.w1 is None or self.b1 is None:
            return np.asarray(1.0 / (1.0 + np.exp(-(vectors @ self.w2 + self.b2))))
        h = np.maximum(np.einsum("nd,kdh->knh", vectors, self.w1) + self.b1[:, None, :], 0.0)
        z = np.einsum("knh,kh->kn", h, self.w2) + self.b2.reshape(-1, 1)
        return np.asarray((1.0 / (1.0 + np.exp(-z))).mean(axis=0))

    @classmethod
    def load(cls, data: bytes) -> Head:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            model_id = str(npz["model_id"])
            if "w1" in npz:
                w1 = np.asarray(npz["w1"], np.float32)
                k = 1 if w1.ndim == 2 else w1.shape[0]
                return cls(w1.reshape(k, *w1.shape[-2:]),
                           np.asarray(npz["b1"], np.float32).reshape(k, -1),
                           np.asarray(npz["w2"], np.float32).reshape(k, -1),
                           np.asarray(npz["b2"], np.float32).reshape(k), model_id)  # fmt: skip
            return cls(None, None, np.asarray(npz["w"], np.float32),
                       np.asarray(npz["b"], np.float32).reshape(()), model_id)  # fmt: skip


class InjectionClassifier:
    """The head plus the embedder it needs, both loaded on first use (thread-safe).

    ``embedder``: injected in tests; default: the process's shared all-MiniLM-L6-v2.
    """

    def __init__(self, head: Head | None = None, embedder: Embedder | None = None) -> None:
        self._head = head
        self._embedder = embedder
        self._lock = threading.Lock()
        self._unavailable: str | None = None

    def _ready(self) -> tuple[Head, Embedder] | None:
        with self._lock:
            if self._unavailable is not None:
                return None
            try:
                if self._head is None:
                    data = importlib.resources.files(__package__).joinpath(WEIGHTS).read_bytes()
                    self._head = Head.load(data)
                if self._embedder is None:
                    from nanocrab.memory.embedder import default_embedder

                    self._embedder = default_embedder()
            except Exception as exc:  # no model files or no weights: heuristics only
                self._unavailable = f"{type(exc).__name__}: {exc}"
                log.warning("injection classifier unavailable, heuristics only: %s",
                            self._unavailable)  # fmt: skip
                return None
            if self._embedder.model_id != self._head.model_id:
                self._unavailable = (f"head trained for {self._head.model_id}, "
                                     f"embedder is {self._embedder.model_id}")  # fmt: skip
                log.warning("injection classifier unavailable: %s", self._unavailable)
                return None
            return self._head, self._embedder

    @property
    def available(self) -> bool:
        """Whether the classifier can run (loads it if needed)."""
        return self._ready() is not None

    def score(self, texts: list[str]) -> tuple[float, int] | None:
        """The highest probability over ``texts`` and its index; ``None`` when unavailable or
        ``texts`` is empty."""
        if not texts:  # nothing to read: the model is not even loaded (~0.3 s at a cold start)
            return None
        ready = self._ready()
        if ready is None:
            return None
        head, embedder = ready
        probs = head.probabilities(embedder.embed(texts))
        best = int(np.argmax(probs))
        return float(probs[best]), best


_shared = InjectionClassifier()


def shared_classifier() -> InjectionClassifier:
    """The process's classifier (the bundled head and the shared embedder)."""
    return _shared
