"""The offline embedder reproduces sentence-transformers' all-MiniLM-L6-v2 (reference vectors
computed once with torch by bench/memory_reference.py), and its cache answers repeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from nanocrab.memory import CachedEmbedder, Embedder, MiniLMEmbedder, Vectors
from nanocrab.memory.embedder import content_key

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    return MiniLMEmbedder()


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
