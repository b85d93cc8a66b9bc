"""The model manifest: what a GGUF holds, tensor by tensor, and the `model_id` that names it.

A manifest lists the architecture and hyperparameters, and for each tensor its name, ggml type,
shape, absolute byte offset and length in the file, the sha256 of its bytes and the layer it
belongs to (None for `token_embd`, `output_norm`, `output`); plus the sha256 of the header bytes
and a digest of the tokenizer and chat-template metadata. Peers verify fetched tensors against it,
and `model_id` (sha256 of the manifest's canonical serialization) names the model in DHT keys,
sessions and artifacts.

Canonical serialization: JSON with sorted keys, no whitespace, ASCII only (a subset of RFC 8785
sufficient here because every value is a string, an integer, a bool, a finite float or a list).

This module reads local files only; it does not fetch anything. It stays one file past the house's
~400 lines: the manifest's fields, their bounds and the reading of a GGUF into them are one schema.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

from swarm.arch import MTP_LAYERS_KEY, arch_row
from swarm.errors import ModelError, ProtocolError
from swarm.ggml_bridge.gguf_header import scan
from swarm.limits import MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB
from swarm.models import cache_dir, check_gguf

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20
"""Bound on a manifest received from a peer (SmolLM2's is ~60 KB; 10,000 tensors fit easily)."""
MAX_FILE_BYTES = 1 << 50
"""Largest model file a manifest may describe (1 PiB)."""
MAX_TENSOR_DIMS = 4
"""ggml's GGML_MAX_DIMS."""
MAX_TENSOR_NAME_CHARS = 256
MAX_ARCH_CHARS = 64

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TOKENIZER_PREFIX = "tokenizer."
# Arrays this long are tokenizer tables or similar: covered by a digest, not copied into hparams.
_MAX_HPARAM_ARRAY = 4096


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the GGUF.

    Attributes:
        name: GGUF tensor name, e.g. `blk.3.attn_q.weight`.
        ggml_type: ggml type id (e.g. 2 = Q4_0, 12 = Q4_K).
        shape: ggml dimension order (ne0 first), as stored in the GGUF.
        offset: absolute byte offset of the tensor's data in the file.
        nbytes: length of the tensor's data in bytes.
        sha256: hex digest of those bytes.
        layer: block index for `blk.N.*` tensors, None for the rest.
    """

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str
    layer: int | None


@dataclass(frozen=True)
class Manifest:
    """Everything a peer needs to fetch, verify and slice one GGUF.

    Attributes:
        arch: `general.architecture`.
        n_layers, n_embd, n_vocab: layers (the block count less the multi-token-prediction blocks,
            `n_mtp_layers`), hidden size, vocabulary size.
        hparams: scalar and short-array metadata (`general.*` and `<arch>.*`), JSON-able values.
        tokenizer_sha256: digest of every `tokenizer.*` key and value (vocab, merges, chat template).
        header_sha256: digest of file bytes [0, data_offset): GGUF header, metadata and tensor infos.
        file_size: bytes.
        data_offset: absolute offset where tensor data starts.
        tensors: in file order.
    """

    arch: str
    n_layers: int
    n_embd: int
    n_vocab: int
    hparams: dict
    tokenizer_sha256: str
    header_sha256: str
    file_size: int
    data_offset: int
    tensors: tuple[TensorInfo, ...]

    def to_bytes(self) -> bytes:
        """Canonical serialization (sorted-key compact ASCII JSON); its sha256 is `model_id`."""
        body = asdict(self)
        body["version"] = MANIFEST_VERSION
        return json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        ).encode()

    @property
    def model_id(self) -> str:
        """Hex sha256 of `to_bytes()`."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes, expected_model_id: str | None = None) -> "Manifest":
        """Parse a manifest received from anywhere, checking it hashes to `expected_model_id`.

        Bounds: input at most MAX_MANIFEST_BYTES; work and memory linear in its size (JSON
        nesting is bounded by Python's recursion limit, and deeper input is refused).

        Raises:
            ProtocolError: not bytes, oversized, not canonical JSON of this version (NaN and
                Infinity are not JSON), a field of the wrong type or out of the bounds of
                `check_manifest`, or a hash that does not match `expected_model_id`.
        """
        if not isinstance(data, bytes):
            raise ProtocolError(f"manifest must be bytes, got {type(data).__name__}")
        if len(data) > MAX_MANIFEST_BYTES:
            raise ProtocolError(f"manifest of {len(data)} bytes exceeds {MAX_MANIFEST_BYTES}")
        if expected_model_id is not None and hashlib.sha256(data).hexdigest() != expected_model_id:
            raise ProtocolError(f"manifest does not hash to model_id {str(expected_model_id)[:16]}...")
        try:
            body = json.loads(data, parse_constant=_refuse_constant)
            if not isinstance(body, dict) or body.pop("version", None) != MANIFEST_VERSION:
                raise ValueError("not a manifest of version 1")
            raw_tensors = body.pop("tensors")
            if not isinstance(raw_tensors, list) or not all(isinstance(t, dict) for t in raw_tensors):
                raise ValueError("tensors must be a list of objects")
            tensors = tuple(TensorInfo(**{**t, "shape": _tuple(t["shape"])}) for t in raw_tensors)
            manifest = cls(**body, tensors=tensors)
            check_manifest(manifest)
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise ProtocolError(f"malformed manifest: {str(e)[:200]}") from None
        if manifest.to_bytes() != data:
            raise ProtocolError("manifest is not in canonical form")
        return manifest

    @property
    def n_mtp_layers(self) -> int:
        """Multi-token-prediction blocks stored after the layers (`<arch>.nextn_predict_layers`, 0
        when absent): tensors `blk.N.*` with n_layers <= N < n_layers + n_mtp_layers
        (`mtp_tensors`). `check_manifest` has checked the value."""
        return self.hparams.get(f"{self.arch}.{MTP_LAYERS_KEY}", 0)

    def mtp_tensors(self) -> tuple[TensorInfo, ...]:
        """Tensors of the multi-token-prediction blocks, in file order (empty without them)."""
        return self.layer_tensors(self.n_layers, self.n_layers + self.n_mtp_layers)

    def mtp_head_tensors(self) -> tuple[TensorInfo, ...]:
        """Tensors the final span's multi-token-prediction head needs besides the span's own: the MTP
        blocks and `token_embd` when a block has no `nextn.embed_tokens` of its own (llama.cpp's head
        embeds its tokens with it). Empty for a model without MTP blocks or whose architecture's row
        does not serve them (`ArchRow.mtp_head`; slicing refuses such a model).

        Raises:
            UnsupportedArchitecture: the model has MTP blocks and its architecture no row.
        """
        if self.n_mtp_layers == 0 or not arch_row(self.arch).mtp_head:
            return ()
        blocks = self.mtp_tensors()
        own = {t.layer for t in blocks if t.name.endswith(".nextn.embed_tokens.weight")}
        if len(own) < self.n_mtp_layers and self.has_tensor("token_embd.weight"):
            blocks = (*blocks, self.tensor("token_embd.weight"))
        return blocks

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name`. Raises KeyError if absent."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def has_tensor(self, name: str) -> bool:
        """Whether the model has a tensor called `name` (e.g. `output.weight` is absent when tied)."""
        return any(t.name == name for t in self.tensors)

    def layer_tensors(self, start: int, end: int) -> tuple[TensorInfo, ...]:
        """Tensors of blocks [start, end), global half-open indices, in file order (MTP blocks are
        blocks n_layers..)."""
        return tuple(t for t in self.tensors if t.layer is not None and start <= t.layer < end)


def check_manifest(m: Manifest) -> None:
    """Check every field's type and bounds (what `from_bytes` and `read_manifest` accept).

    Bounds: arch 1..MAX_ARCH_CHARS chars; 1 <= n_layers <= limits.MAX_LAYERS; 1 <= n_embd <=
    limits.MAX_HIDDEN; 0 <= n_vocab <= limits.MAX_VOCAB; `<arch>.context_length`, when present, an
    integer >= 1; digests 64 lowercase hex; 0 <= data_offset <= file_size <= MAX_FILE_BYTES; each
    tensor named once (1..MAX_TENSOR_NAME_CHARS chars), 1..MAX_TENSOR_DIMS dims, its bytes inside
    [data_offset, file_size), its layer the N of a `blk.N.` name (< n_layers + the integer
    `<arch>.nextn_predict_layers` in [0, MAX_LAYERS], 0 when absent), else None.

    Raises:
        ValueError: the first violated bound (TypeError for a wrong type).
    """
    if not isinstance(m.arch, str) or not 1 <= len(m.arch) <= MAX_ARCH_CHARS:
        raise ValueError(f"arch must be a string of 1..{MAX_ARCH_CHARS} chars")
    _check_int("n_layers", m.n_layers, 1, MAX_LAYERS)
    _check_int("n_embd", m.n_embd, 1, MAX_HIDDEN)
    _check_int("n_vocab", m.n_vocab, 0, MAX_VOCAB)
    if not isinstance(m.hparams, dict):
        raise TypeError("hparams must be an object")
    ctx_key = f"{m.arch}.context_length"
    if ctx_key in m.hparams:
        _check_int(ctx_key, m.hparams[ctx_key], 1, 2**63 - 1)
    mtp_key = f"{m.arch}.{MTP_LAYERS_KEY}"
    n_mtp = m.hparams.get(mtp_key, 0)
    _check_int(mtp_key, n_mtp, 0, MAX_LAYERS)
    for name in ("tokenizer_sha256", "header_sha256"):
        if not isinstance(getattr(m, name), str) or not _HEX64.fullmatch(getattr(m, name)):
            raise ValueError(f"{name} must be 64 lowercase hex chars")
    _check_int("file_size", m.file_size, 0, MAX_FILE_BYTES)
    _check_int("data_offset", m.data_offset, 0, m.file_size)
    if not isinstance(m.tensors, tuple):
        raise TypeError("tensors must be a list")
    names = set()
    for t in m.tensors:
        if not isinstance(t.name, str) or not 1 <= len(t.name) <= MAX_TENSOR_NAME_CHARS or t.name in names:
            raise ValueError(f"tensor name {str(t.name)[:80]!r} is empty, too long or repeated")
        names.add(t.name)
        _check_int("ggml_type", t.ggml_type, 0, 1023)
        if not isinstance(t.shape, tuple) or not 1 <= len(t.shape) <= MAX_TENSOR_DIMS:
            raise ValueError(f"tensor {t.name!r} must have 1..{MAX_TENSOR_DIMS} dims")
        for d in t.shape:
            _check_int("shape", d, 0, MAX_FILE_BYTES)
        _check_int("offset", t.offset, m.data_offset, m.file_size)
        _check_int("nbytes", t.nbytes, 0, m.file_size - t.offset)
        if not isinstance(t.sha256, str) or not _HEX64.fullmatch(t.sha256):
            raise ValueError(f"tensor {t.name!r} sha256 must be 64 lowercase hex chars")
        want = int(g.group(1)) if (g := _LAYER_RE.match(t.name)) else None
        if want is not None and not want < m.n_layers + n_mtp or t.layer != want or isinstance(t.layer, bool):
            raise ValueError(f"tensor {t.name!r} has layer {t.layer!r}, expected {want!r} < n_layers "
                             f"(+ {n_mtp} MTP blocks)")


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} {v} is outside [{lo}, {hi}]")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _tuple(v: object) -> tuple:
    if not isinstance(v, list):
        raise TypeError("tensor shape must be a list")
    return tuple(v)


def build_manifest(path: str | Path) -> Manifest:
    """The manifest of a local GGUF, from the manifest cache when the file is unchanged.

    The cache (`$SWARM_MODELS/../manifests` beside the model cache) is keyed by the file's real
    path, size and mtime; a cached manifest is re-read through `Manifest.from_bytes`, and any
    problem with it falls back to hashing the file again.

    Raises:
        ModelError: missing file, not GGUF, or a GGUF the `gguf` package cannot parse.
    """
    path = check_gguf(Path(path))
    st = path.stat()
    # os.fsencode: a path need not be UTF-8 (a Latin-1 file name arrives with surrogate escapes).
    stamp = os.fsencode(path.resolve()) + f"|{st.st_size}|{st.st_mtime_ns}".encode()
    key = hashlib.sha256(stamp).hexdigest()[:32]
    entry = cache_dir().parent / "manifests" / f"{key}.json"
    try:
        return Manifest.from_bytes(entry.read_bytes())
    except (OSError, ProtocolError):
        pass
    manifest = read_manifest(path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(manifest.to_bytes())
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only cache only costs the hashing next time
    return manifest


def read_manifest(path: str | Path) -> Manifest:
    """Read a local GGUF and build its manifest, hashing every tensor (~0.3 s per 100 MB).

    Bounds: memory for the metadata the `gguf` package materialises (linear in the header's size;
    tensor data is memory-mapped and hashed in place); the manifest must pass `check_manifest`.

    Raises:
        ModelError: missing file, not GGUF, a header the `gguf` package cannot parse (truncated,
            counts or offsets past the end, text that is not UTF-8, unknown types), missing or
            mistyped metadata, or a manifest out of the bounds of `check_manifest`.
    """
    path = check_gguf(Path(path))
    try:
        return _read_manifest(path)
    except ModelError:
        raise
    except _GGUF_ERRORS as e:
        raise ModelError(f"cannot parse GGUF {path}: {type(e).__name__}: {str(e)[:200]}") from e


_GGUF_ERRORS = (
    ValueError, TypeError, KeyError, IndexError, OverflowError, OSError, struct.error, RecursionError
)
"""What the `gguf` package (numpy views over the mapped file) raises on a malformed header."""


def _read_manifest(path: Path) -> Manifest:
    scan(path)  # the bounded scanner first: counts and lengths the `gguf` package would follow blindly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gguf warns (and goes on) about duplicate keys
        reader = GGUFReader(path)
    fields = {
        name: _field_value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.") and (name.startswith(_TOKENIZER_PREFIX) or _small_field(field))
    }
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path}: no general.architecture in GGUF metadata")
    try:
        # llama.cpp counts the multi-token-prediction blocks in block_count: the layers are the rest
        n_layers = _metadata_int(fields[f"{arch}.block_count"]) - _metadata_int(
            fields.get(f"{arch}.{MTP_LAYERS_KEY}", 0))
        n_embd = _metadata_int(fields[f"{arch}.embedding_length"])
    except KeyError as e:
        raise ModelError(f"{path}: missing metadata key {e.args[0]}") from e
    tokens = fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else _metadata_int(fields.get(f"{arch}.vocab_size", 0))

    data_offset = min(t.data_offset for t in reader.tensors) if reader.tensors else path.stat().st_size
    mm = reader.data
    tensors = tuple(
        TensorInfo(
            name=t.name,
            ggml_type=int(t.tensor_type),
            shape=tuple(int(d) for d in t.shape),
            offset=int(t.data_offset),
            nbytes=int(t.n_bytes),
            sha256=hashlib.sha256(mm[t.data_offset : t.data_offset + t.n_bytes]).hexdigest(),
            layer=int(m.group(1)) if (m := _LAYER_RE.match(t.name)) else None,
        )
        for t in sorted(reader.tensors, key=lambda t: t.data_offset)
    )
    tokenizer = {k: v for k, v in fields.items() if k.startswith(_TOKENIZER_PREFIX)}
    hparams = {k: v for k, v in fields.items() if not k.startswith(_TOKENIZER_PREFIX) and _small(v)}
    manifest = Manifest(
        arch=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_vocab=n_vocab,
        hparams=hparams,
        tokenizer_sha256=hashlib.sha256(_canonical(tokenizer)).hexdigest(),
        header_sha256=hashlib.sha256(mm[:data_offset]).hexdigest(),
        file_size=path.stat().st_size,
        data_offset=int(data_offset),
        tensors=tensors,
    )
    try:
        check_manifest(manifest)
    except (ValueError, TypeError) as e:
        raise ModelError(f"{path}: {e}") from None
    return manifest


def _metadata_int(v: object) -> int:
    """A GGUF integer field (any integer type); bools, floats and strings are refused."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected an integer metadata value, got {type(v).__name__}")
    return v


def _field_value(field):
    value = field.contents()
    if field.types and field.types[0] == GGUFValueType.ARRAY and not isinstance(value, list):
        value = list(value)
    return _jsonable(value)


def _jsonable(value):
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


def _small(value) -> bool:
    return not isinstance(value, list) or len(value) <= _MAX_HPARAM_ARRAY


def _small_field(field) -> bool:
    """Whether a field would pass `_small` (a long array outside `tokenizer.*` is never read)."""
    return not (field.types and field.types[0] == GGUFValueType.ARRAY) or len(field.data) <= _MAX_HPARAM_ARRAY


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
