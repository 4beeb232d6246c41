"""Memory: sentence embeddings (offline) and a vector store in the projections database."""

from nanocrab.memory.embedder import (
    CachedEmbedder,
    Embedder,
    MiniLMEmbedder,
    Vectors,
    default_embedder,
)
from nanocrab.memory.errors import DimensionError, ModelNotFoundError, NanocrabMemoryError
from nanocrab.memory.store import Hit, IndexKind, MemoryItem, VectorStore

__all__ = [
    "CachedEmbedder",
    "DimensionError",
    "Embedder",
    "Hit",
    "IndexKind",
    "MemoryItem",
    "MiniLMEmbedder",
    "ModelNotFoundError",
    "NanocrabMemoryError",
    "VectorStore",
    "Vectors",
    "default_embedder",
]
