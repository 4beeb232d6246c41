"""The offline embedder reproduces sentence-transformers' all-MiniLM-L6-v2 (reference vectors
computed once with torch by bench/memory_reference.py), and its cache answers repeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from nanocrab.memory import CachedEmbedder, Embedder, MiniLMEmbedder, Vectors
from nanocrab.memory.embedder import content_key

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"


@pytest.fixture(scope="module", params=["onnx-int8", "onnx", "numpy"])
def model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> MiniLMEmbedder:
    """Every forward pass: onnxruntime with int8 weights (the default) and in float32, and the
    numpy fallback."""
    cache = tmp_path_factory.mktemp("onnx-cache")
    embedder = MiniLMEmbedder(backend=request.param, cache_dir=cache)
    assert embedder.backend == request.param
    return embedder


def reference() -> tuple[list[str], np.ndarray]:
    data = json.loads(REFERENCE.read_text())
    return [i["text"] for i in data["items"]], np.array(
        [i["vector"] for i in data["items"]], dtype=np.float32
    )


def test_matches_the_reference_implementation(model: MiniLMEmbedder) -> None:
    texts, expected = reference()
    assert len(texts) >= 20
    got = model.embed(texts)
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    cosine = (got * expected).sum(axis=1) / np.linalg.norm(expected, axis=1)
    if model.backend == "onnx-int8":
        # quantised weights and activations: close to the reference, not equal (measured
        # 0.980 at worst, 0.991 on average; recall@5 and routing unchanged, bench/)
        assert cosine.min() >= 0.97 and cosine.mean() >= 0.985, cosine.tolist()
    else:
        assert cosine.min() >= 0.999, dict(zip(texts, cosine.tolist(), strict=True))


def test_one_at_a_time_equals_batched(model: MiniLMEmbedder) -> None:
    texts, _ = reference()
    batched = model.embed(texts)
    single = np.stack([model.embed([t])[0] for t in texts])
    assert np.allclose(single, batched, atol=1e-5)
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_similar_texts_score_higher_than_unrelated_ones(model: MiniLMEmbedder) -> None:
    a, b, c = model.embed(
        [
            "fix the failing unit test in the parser",
            "the parser's unit tests fail, repair them",
            "book a table for two at an Italian restaurant",
        ]
    )
    assert a @ b > 0.6 > a @ c


def test_nothing_to_embed(model: MiniLMEmbedder) -> None:
    assert model.embed([]).shape == (0, 384)
    assert isinstance(model, Embedder) and model.dim == 384
    assert model.model_id == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.parametrize("backend", ["onnx-int8", "onnx"])
def test_the_onnx_graph_is_built_once_and_cached(tmp_path: Path, backend: str) -> None:
    """The first load writes the graph into the cache (content-addressed by the weights), a
    second load reuses that file, and both give the same vectors."""
    first = MiniLMEmbedder(backend=backend, cache_dir=tmp_path)
    files = list(tmp_path.glob("minilm-*.onnx"))
    assert len(files) == 1 and files[0].name.endswith("-int8.onnx") == (backend == "onnx-int8")
    stamp = files[0].stat().st_mtime_ns
    second = MiniLMEmbedder(backend=backend, cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == stamp and len(list(tmp_path.glob("*.onnx"))) == 1
    text = ["recall the deployment checklist"]
    assert np.array_equal(first.embed(text), second.embed(text))


def test_the_default_is_int8_and_a_text_s_vector_does_not_depend_on_its_batch(
    tmp_path: Path,
) -> None:
    """int8 activations are scaled per run: each text runs alone, so its vector is the same
    whatever it is embedded with (the memory store and the embedding cache rely on it)."""
    model = MiniLMEmbedder(cache_dir=tmp_path)
    assert model.backend == "onnx-int8"
    short, long_ = "ok", "a much longer text about deployment checklists " * 20
    alone = model.embed([short])
    together = model.embed([long_, short, "and a third one"])
    assert np.array_equal(alone[0], together[1])


def test_the_cache_key_is_hashed_once_per_version_of_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashing the 90 MB of weights is remembered under the files' identity; a changed file
    is hashed again (and so never finds another version's graph)."""
    from nanocrab.memory import onnx_minilm

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 4}')
    (model / "model.safetensors").write_bytes(b"weights v1")
    cache = tmp_path / "cache"
    first = onnx_minilm.known_key(model, cache)
    assert first == onnx_minilm.model_key(model)
    hashed: list[Path] = []
    real = onnx_minilm.model_key
    monkeypatch.setattr(onnx_minilm, "model_key", lambda d: hashed.append(d) or real(d))
    assert onnx_minilm.known_key(model, cache) == first and hashed == []
    (model / "model.safetensors").write_bytes(b"weights v2, longer")
    second = onnx_minilm.known_key(model, cache)
    assert second != first and hashed == [model]
    assert onnx_minilm.known_key(model, cache) == second and hashed == [model]


def test_an_unwritable_cache_still_loads(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    model = MiniLMEmbedder(backend="onnx", cache_dir=blocked / "cache")
    assert model.embed(["still works"]).shape == (1, 384)


def test_without_onnxruntime_numpy_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from nanocrab.memory import onnx_minilm
    from nanocrab.memory.errors import NanocrabMemoryError

    monkeypatch.setattr(onnx_minilm, "ort_available", lambda: False)
    assert MiniLMEmbedder().backend == "numpy"
    with pytest.raises(NanocrabMemoryError, match="onnxruntime"):
        MiniLMEmbedder(backend="onnx")
    monkeypatch.setenv("NANOCRAB_EMBED_BACKEND", "numpy")
    monkeypatch.setattr(onnx_minilm, "ort_available", lambda: True)
    assert MiniLMEmbedder().backend == "numpy"


def test_int8_that_cannot_run_falls_back_to_float32_unless_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A CPU or onnxruntime build without int8 kernels: the float32 graph runs instead (not
    the numpy pass, ~3x slower); asking for onnx-int8 explicitly raises."""
    from nanocrab.memory import ModelNotFoundError, onnx_minilm

    real = onnx_minilm.open_session

    def no_int8(model: Path | bytes, threads: int = 1) -> onnx_minilm.OrtSession:
        if isinstance(model, Path) and model.name.endswith("-int8.onnx"):
            raise RuntimeError("MatMulInteger: not implemented")
        return real(model, threads)

    monkeypatch.setattr(onnx_minilm, "open_session", no_int8)
    model = MiniLMEmbedder(cache_dir=tmp_path)
    assert model.backend == "onnx" and model.embed(["falls back"]).shape == (1, 384)
    with pytest.raises(ModelNotFoundError, match="MatMulInteger"):
        MiniLMEmbedder(backend="onnx-int8", cache_dir=tmp_path)


def test_a_failing_onnx_session_falls_back_unless_onnx_was_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from nanocrab.memory import ModelNotFoundError, onnx_minilm

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no kernel for this CPU")

    monkeypatch.setattr(onnx_minilm, "open_session", broken)
    model = MiniLMEmbedder(cache_dir=tmp_path)
    assert model.backend == "numpy" and model.embed(["falls back"]).shape == (1, 384)
    with pytest.raises(ModelNotFoundError, match="no kernel"):
        MiniLMEmbedder(backend="onnx", cache_dir=tmp_path)


class Counting:
    """An Embedder that counts the texts it is asked to embed."""

    model_id, dim = "counting", 4

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.seen += texts
        return np.array([[len(t), 1, 0, 0] for t in texts], dtype=np.float32).reshape(-1, 4)


def test_the_cache_embeds_each_content_once(tmp_path: Path) -> None:
    inner = Counting()
    cached = CachedEmbedder(inner, max_entries=2)
    first = cached.embed(["a", "bb", "a"])
    assert inner.seen == ["a", "bb"]
    assert np.array_equal(cached.embed(["bb", "a"]), first[[1, 0]])
    assert inner.seen == ["a", "bb"]
    cached.embed(["ccc"])  # evicts the least recently used ("bb")
    cached.embed(["bb"])
    assert inner.seen == ["a", "bb", "ccc", "bb"]
    assert content_key("m", "a") != content_key("other", "a")


class Gated(Counting):
    """A Counting embedder that holds each call until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.entered = threading.Event()
        self.both = threading.Event()
        self.gate = threading.Event()
        self.fail = False

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls += 1
        calls = self.calls
        self.entered.set()
        if self.calls == 2:
            self.both.set()
        if not self.gate.is_set():
            assert self.gate.wait(30)
        if self.fail and calls == 1:  # only the first call falls over
            raise RuntimeError("the model fell over")
        return super().embed(texts)


@pytest.mark.parametrize("first_fails", [False, True])
def test_a_text_being_embedded_is_waited_for_not_embedded_twice(first_fails: bool) -> None:
    # the LLM handler's early recall (a thread) and the guardrails' classifier (the loop)
    # embed the same task side by side
    inner = Gated()
    inner.fail = first_fails
    cached = CachedEmbedder(inner)
    results: dict[str, object] = {}

    def first() -> None:
        try:
            results["first"] = cached.embed(["the task"])
        except RuntimeError as exc:
            results["first"] = exc

    worker = threading.Thread(target=first)
    worker.start()
    assert inner.entered.wait(30)  # the first call is computing "the task"
    second = threading.Thread(target=lambda: results.update(second=cached.embed(["the task", "x"])))
    second.start()
    assert inner.both.wait(30)  # the second call is computing what it lacks: only "x"
    inner.gate.set()
    worker.join(30)
    second.join(30)
    if first_fails:  # the waiter embeds it itself
        assert isinstance(results["first"], RuntimeError)
        assert sorted(inner.seen) == ["the task", "x"]
    else:
        assert inner.seen.count("the task") == 1
        assert np.array_equal(results["second"][0], results["first"][0])  # type: ignore[index]
    assert np.array_equal(results["second"][0], [8, 1, 0, 0])  # type: ignore[index]


def test_the_disk_cache_survives_a_restart(tmp_path: Path) -> None:
    inner = Counting()
    path = tmp_path / "cache" / "embeddings.db"
    one = CachedEmbedder(inner, disk_path=path)
    vectors = one.embed(["x", "yy"])
    one.close()
    two = CachedEmbedder(inner, disk_path=path)
    assert np.array_equal(two.embed(["yy", "x", "zzz"])[:2], vectors[[1, 0]])
    assert inner.seen == ["x", "yy", "zzz"]
    two.close()


def test_runs_offline_without_torch_or_the_hub() -> None:
    """Loading the model and embedding opens no socket and imports neither torch,
    transformers nor huggingface_hub (a fresh interpreter, with sockets disabled)."""
    code = (
        "import socket, sys\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket.connect = refuse; socket.create_connection = refuse\n"
        "from nanocrab.memory import MiniLMEmbedder\n"
        "assert MiniLMEmbedder().embed(['offline']).shape == (1, 384)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'huggingface_hub', 'sentence_transformers')]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
