"""Compute the reference embeddings of tests/data/minilm_reference.json with the reference
implementation (sentence-transformers on torch), once, outside the project's venv.

The project never imports torch: this script runs in a throwaway venv, e.g.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0+cpu sentence-transformers   # from a local wheel
    HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python bench/memory_reference.py MODEL_DIR

MODEL_DIR is the model directory nanocrab loads (``nanocrab.memory.embedder.find_model_dir()``),
so both sides read the same weights; the test compares nanocrab's vectors to these.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TEXTS = [
    "fix the failing test in tests/test_parser.py",
    "Summarise the last three emails from Alice about the Q3 budget.",
    "Refactor the database layer to use SQLAlchemy 2 async sessions.",
    "hello",
    "",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "pip install -e '.[dev]' fails with: error: subprocess-exited-with-error",
    "Écris un résumé du rapport trimestriel en français, s'il te plaît.",
    "请把这个函数改写成异步版本，并添加单元测试。",  # noqa: RUF001
    "Deploy 🚀 the new release to staging and run the smoke tests ✅",
    "SELECT user_id, COUNT(*) FROM orders WHERE created_at > now() - interval '7 days' GROUP BY 1;",
    'Traceback (most recent call last):\n  File "app.py", line 12, in <module>\n'
    "    main()\nKeyError: 'OPENAI_API_KEY'",
    "URGENT!!! The production server at 10.0.3.17 is returning HTTP 502 errors since 14:05 UTC",
    "Rename variable `cnt` to `count` everywhere in src/",
    "What is the weather in Paris tomorrow?",
    "   leading and trailing whitespace   ",
    "Write a bash script that backs up /var/lib/postgresql every night at 02:00 and keeps 7 "
    "days of archives, compressing them with zstd.",
    # longer than the model's 256-token window: the reference truncates, so must we
    " ".join(
        f"Step {i}: open the log file, search for the error code E{i:03d}, and note the timestamp."
        for i in range(60)
    ),
]


def main(model_dir: str, out: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(TEXTS, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    import sentence_transformers
    import torch

    payload = {
        "reference": f"sentence-transformers {sentence_transformers.__version__}, "
        f"torch {torch.__version__}, max_seq_length {model.max_seq_length}",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "items": [
            {"text": t, "vector": [round(float(x), 7) for x in v]}
            for t, v in zip(TEXTS, vectors, strict=True)
        ],
    }
    out.write_text(json.dumps(payload, ensure_ascii=False) + "\n")
    print(f"wrote {len(TEXTS)} vectors of dim {vectors.shape[1]} to {out}")


if __name__ == "__main__":
    main(sys.argv[1], Path(__file__).parent.parent / "tests" / "data" / "minilm_reference.json")
