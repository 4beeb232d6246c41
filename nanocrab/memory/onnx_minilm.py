"""all-MiniLM-L6-v2 on onnxruntime: the ONNX graph built from the safetensors weights, cached.

No package ships an ONNX export of the model (making one takes torch), so :func:`build_model`
writes the graph (protobuf encoded here: no ``onnx`` package needed), operator for operator
the forward pass of :class:`nanocrab.memory.embedder.MiniLMEmbedder` (embeddings: word +
position + token type 0, LayerNorm; per layer: Q/K/V projections, scaled scores plus an
additive key mask, softmax, output projection, residual, LayerNorm, GELU (erf form)
feed-forward, residual, LayerNorm; then mean pooling over the attention mask). The graph's
output is the pooled vector, not yet normalised.

:func:`cached_model` writes it once to ``<cache dir>/minilm-<sha256 of the weights, the config
and the graph layout>.onnx`` (~90 MB), so later loads skip the rebuild (~1 s); the key itself
is remembered in ``<cache dir>/keys.json`` under the files' identity (:func:`known_key`), so
later loads skip hashing the weights too. An unwritable cache directory only means the graph is
rebuilt in memory at each load.

onnxruntime ships no type stubs: :class:`OrtSession` is the narrow typed surface used here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

OPSET = 17  # LayerNormalization is a standard operator from 17 on
_GRAPH_LAYOUT = "1"  # bump when build_model's graph changes: it is part of the cache key


class OrtSession(Protocol):
    """The part of ``onnxruntime.InferenceSession`` used here."""

    def run(
        self, output_names: list[str] | None, input_feed: dict[str, npt.NDArray[Any]]
    ) -> list[npt.NDArray[Any]]: ...


def ort_available() -> bool:
    """True when onnxruntime can be imported (it is a dependency; this covers broken wheels)."""
    try:
        import onnxruntime  # type: ignore[import-untyped]  # noqa: F401
    except Exception:  # an ImportError, or a wheel whose shared library does not load
        return False
    return True


def default_cache_dir() -> Path:
    """``$NANOCRAB_MODEL_CACHE``, else ``$XDG_CACHE_HOME/nanocrab/models``, else
    ``~/.cache/nanocrab/models``: per user, shared by every data directory (the file depends
    only on the installed weights)."""
    explicit = os.environ.get("NANOCRAB_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nanocrab" / "models"


_KEYED = ("config.json", "model.safetensors")


def model_key(model_dir: Path) -> str:
    """The cache key: SHA-256 of the weights, the config and the graph layout (24 hex digits)."""
    digest = hashlib.sha256(_GRAPH_LAYOUT.encode())
    for name in _KEYED:
        with (model_dir / name).open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def known_key(model_dir: Path, cache_dir: Path) -> str:
    """:func:`model_key`, remembered in ``<cache dir>/keys.json`` under the files' identity
    (path, device, inode, size, modification time): hashing 90 MB of weights took ~65 ms of
    every model load. Any change to a file changes its identity, and the key is computed again."""
    try:
        files = [(model_dir / name).resolve() for name in _KEYED]
        stats = [f.stat() for f in files]
    except (OSError, RuntimeError):  # unreadable, or a symlink loop
        return model_key(model_dir)
    identity = "|".join(f"{f}:{s.st_dev}:{s.st_ino}:{s.st_size}:{s.st_mtime_ns}"
                        for f, s in zip(files, stats, strict=True))  # fmt: skip
    identity = f"{_GRAPH_LAYOUT}|{identity}"
    keys_file = cache_dir / "keys.json"
    try:
        keys = json.loads(keys_file.read_text())
        if isinstance(keys, dict) and isinstance(keys.get(identity), str):
            return str(keys[identity])
    except (OSError, ValueError):
        keys = {}
    key = model_key(model_dir)
    try:
        keys = keys if isinstance(keys, dict) else {}
        keys[identity] = key
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".keys-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(keys, f)
        os.replace(tmp, keys_file)
    except OSError as exc:
        log.debug("cannot remember the model's key in %s: %s", cache_dir, exc)
    return key


# -- ONNX protobuf, written directly ------------------------------------------------------
# The few messages of onnx.proto the graph needs, in protobuf's wire format (field numbers from
# onnx.proto), so that building the graph needs no ``onnx`` package (31 MB installed).

_FLOAT, _INT8, _INT64 = 1, 3, 7  # TensorProto.DataType
_ATTR_FLOAT, _ATTR_INT, _ATTR_INTS = 1, 2, 7  # AttributeProto.AttributeType


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten bytes of two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _len(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _attribute(name: str, value: int | float | list[int]) -> bytes:
    if isinstance(value, list):
        return b"".join([_len(1, name), *(_int(8, v) for v in value), _int(20, _ATTR_INTS)])
    if isinstance(value, float):
        f32 = _varint(2 << 3 | 5) + struct.pack("<f", value)  # field 2, fixed32
        return _len(1, name) + f32 + _int(20, _ATTR_FLOAT)
    return _len(1, name) + _int(3, value) + _int(20, _ATTR_INT)


def _node(op: str, inputs: list[str], output: str | list[str], attrs: dict[str, Any]) -> bytes:
    outputs = [output] if isinstance(output, str) else output
    return b"".join(
        [*(_len(1, i) for i in inputs), *(_len(2, o) for o in outputs), _len(3, outputs[0]),
         _len(4, op)]
        + [_len(5, _attribute(k, v)) for k, v in attrs.items()]
    )


def _tensor(name: str, value: npt.NDArray[Any]) -> bytes:
    kind = {np.dtype(np.float32): _FLOAT, np.dtype(np.int64): _INT64,
            np.dtype(np.int8): _INT8}[value.dtype]
    raw = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False)
    dims = b"".join(_int(1, d) for d in value.shape)
    return dims + _int(2, kind) + _len(8, name) + _len(9, raw.tobytes())


def _value_info(name: str, kind: int, shape: list[int | str]) -> bytes:
    dims = b"".join(_len(1, _int(1, d) if isinstance(d, int) else _len(2, d)) for d in shape)
    tensor_type = _int(1, kind) + _len(2, dims)
    return _len(1, name) + _len(2, _len(1, tensor_type))


_QMAX = 63
"""int8 weights use 7 bits (±63): on x86 CPUs without VNNI, onnxruntime's u8 by s8 kernels add
pairs of products in 16 bits, which saturate with full-range weights."""


def build_model(model_dir: Path, int8: bool = False) -> bytes:
    """The serialised ONNX model of the BERT encoder in ``model_dir`` with mean pooling.

    Inputs: ``input_ids`` int64 ``(n, length)``, ``attention_mask`` float32 ``(n, length)``
    (1 for tokens, 0 for padding). Output: ``pooled`` float32 ``(n, hidden)``.
    """
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    w: dict[str, npt.NDArray[np.float32]] = load_file(str(model_dir / "model.safetensors"))
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    hd, eps = hidden // heads, float(config["layer_norm_eps"])
    inits: list[bytes] = []
    nodes: list[bytes] = []

    def const(name: str, value: npt.NDArray[Any]) -> str:
        inits.append(_len(5, _tensor(name, value)))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(_len(1, _node(op, inputs, output, attrs)))
        return output

    quantized: dict[str, tuple[str, ...]] = {}  # an input -> its DynamicQuantizeLinear outputs

    def quantize(x: str) -> tuple[str, ...]:  # (values, scale, zero point), once per input
        if x not in quantized:
            quantized[x] = (f"{x}.q", f"{x}.q_scale", f"{x}.q_zero")
            nodes.append(_len(1, _node("DynamicQuantizeLinear", [x], list(quantized[x]), {})))
        return quantized[x]

    def linear(x: str, weight: str, out: str) -> str:  # x @ W.T + b, W as PyTorch's (out, in)
        b = const(f"{weight}.bias", w[f"{weight}.bias"])
        if not int8:
            dense = const(f"{weight}.T", w[f"{weight}.weight"].T)
            return node("Add", [node("MatMul", [x, dense], f"{out}.mm"), b], out)
        xq, xs, xz = quantize(x)  # Q, K and V share their input's
        wt = w[f"{weight}.weight"].T.astype(np.float32)
        wscale = np.maximum(np.abs(wt).max(axis=0), 1e-12) / _QMAX
        wq = const(f"{weight}.Tq", np.clip(np.rint(wt / wscale), -_QMAX, _QMAX).astype(np.int8))
        wz = const(f"{weight}.Tz", np.zeros(wt.shape[1], dtype=np.int8))
        ws = const(f"{weight}.Ts", wscale.astype(np.float32))
        acc = node("Cast", [node("MatMulInteger", [xq, wq, xz, wz], f"{out}.mmi")], f"{out}.mmf",
                   to=_FLOAT)
        scale = node("Mul", [xs, ws], f"{out}.mms")
        return node("Add", [node("Mul", [acc, scale], f"{out}.mm"), b], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        scale = const(f"{prefix}.weight", w[f"{prefix}.weight"])
        bias = const(f"{prefix}.bias", w[f"{prefix}.bias"])
        return node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=eps)

    f32 = np.float32
    const("zero", np.array([0], dtype=np.int64))
    const("one", np.array([1], dtype=np.int64))
    const("heads_shape", np.array([0, 0, heads, hd], dtype=np.int64))
    const("hidden_shape", np.array([0, 0, hidden], dtype=np.int64))
    const("mask_axes", np.array([1, 2], dtype=np.int64))
    const("pool_axis", np.array([1], dtype=np.int64))
    const("scale", np.array(1.0 / np.sqrt(hd), dtype=f32))
    const("neg_big", np.array(-1e9, dtype=f32))
    const("f_one", np.array(1.0, dtype=f32))
    const("f_half", np.array(0.5, dtype=f32))
    const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0), dtype=f32))
    const("tiny", np.array(1e-9, dtype=f32))

    # embeddings: word[ids] + position[:length] + token_type[0], LayerNorm
    word = const("word", w["embeddings.word_embeddings.weight"])
    pos = const("pos", w["embeddings.position_embeddings.weight"])
    type0 = const("type0", w["embeddings.token_type_embeddings.weight"][0])
    length = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), "one"], "length", axis=0)
    x = node("Add", [node("Gather", [word, "input_ids"], "emb_word"),
                     node("Slice", [pos, "zero", length], "emb_pos")], "emb_wp")  # fmt: skip
    x = layer_norm(node("Add", [x, type0], "emb_sum"), "embeddings.LayerNorm", "emb")
    # additive attention mask: (n, 1, 1, length), -1e9 on padded keys
    inverted = node("Sub", ["f_one", "attention_mask"], "mask_inv")
    mask_bias = node(
        "Unsqueeze", [node("Mul", [inverted, "neg_big"], "mask_neg"), "mask_axes"], "mask_bias"
    )
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        att = f"{p}attention."

        def split_heads(t: str, perm: list[int], out: str) -> str:
            return node("Transpose", [node("Reshape", [t, "heads_shape"], f"{out}.r")], out,
                        perm=perm)  # fmt: skip

        q = split_heads(linear(x, f"{att}self.query", f"{p}q"), [0, 2, 1, 3], f"{p}qh")
        kt = split_heads(linear(x, f"{att}self.key", f"{p}k"), [0, 2, 3, 1], f"{p}kt")
        v = split_heads(linear(x, f"{att}self.value", f"{p}v"), [0, 2, 1, 3], f"{p}vh")
        scores = node("Mul", [node("MatMul", [q, kt], f"{p}qk"), "scale"], f"{p}scaled")
        probs = node("Softmax", [node("Add", [scores, mask_bias], f"{p}masked")], f"{p}probs",
                     axis=-1)  # fmt: skip
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{p}ctx_h")], f"{p}ctx_t",
                   perm=[0, 2, 1, 3])  # fmt: skip
        ctx = node("Reshape", [ctx, "hidden_shape"], f"{p}ctx")
        att_out = linear(ctx, f"{att}output.dense", f"{p}att")
        x = layer_norm(node("Add", [att_out, x], f"{p}res1"), f"{att}output.LayerNorm", f"{p}ln1")
        ff = linear(x, f"{p}intermediate.dense", f"{p}ff")
        erf = node("Erf", [node("Mul", [ff, "inv_sqrt2"], f"{p}ff_s")], f"{p}erf")
        gelu = node("Mul", [node("Mul", [ff, "f_half"], f"{p}ff_h"),
                            node("Add", [erf, "f_one"], f"{p}erf1")], f"{p}gelu")  # fmt: skip
        ff_out = linear(gelu, f"{p}output.dense", f"{p}ffo")
        x = layer_norm(node("Add", [ff_out, x], f"{p}res2"), f"{p}output.LayerNorm", f"{p}ln2")
    # mean pooling over the attention mask
    mask3 = node("Unsqueeze", ["attention_mask", "mask_axes_last"], "mask3")
    const("mask_axes_last", np.array([2], dtype=np.int64))
    summed = node("ReduceSum", [node("Mul", [x, mask3], "masked_tokens"), "pool_axis"],
                  "summed", keepdims=0)  # fmt: skip
    count = node("Max", [node("ReduceSum", ["attention_mask", "pool_axis"], "count_raw",
                              keepdims=1), "tiny"], "count")  # fmt: skip
    node("Div", [summed, count], "pooled")
    graph = b"".join(
        [*nodes, _len(2, "all-MiniLM-L6-v2"), *inits,
         _len(11, _value_info("input_ids", _INT64, ["n", "length"])),
         _len(11, _value_info("attention_mask", _FLOAT, ["n", "length"])),
         _len(12, _value_info("pooled", _FLOAT, ["n", hidden]))]
    )  # fmt: skip
    opset = _len(1, "") + _int(2, OPSET)
    # ir_version 8: readable by any onnxruntime >= 1.10
    return _int(1, 8) + _len(2, "nanocrab") + _len(7, graph) + _len(8, opset)


def cached_model(
    model_dir: Path, cache_dir: Path | None = None, *, int8: bool = False
) -> Path | bytes:
    """The model file in the cache (built and written on first use), or the model's bytes when
    the cache directory cannot be written. ``int8``: the graph of :func:`build_model` with
    ``int8`` (its own file)."""
    cache_dir = cache_dir or default_cache_dir()
    suffix = "-int8" if int8 else ""
    path = cache_dir / f"minilm-{known_key(model_dir, cache_dir)}{suffix}.onnx"
    if path.is_file():
        return path
    data = build_model(model_dir, int8=int8)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".minilm-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: a concurrent loader sees the whole file or none
    except OSError as exc:
        log.warning("cannot cache the ONNX model in %s (%s): built in memory", cache_dir, exc)
        return data
    return path


def open_session(model: Path | bytes, threads: int = 1) -> OrtSession:
    """An onnxruntime CPU session on ``model``, all graph optimisations, ``threads`` intra-op
    threads (no spinning: the cores are shared with the runtime's other work)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    source = str(model) if isinstance(model, Path) else model
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return cast(OrtSession, session)
