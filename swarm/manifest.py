"""The model manifest: what a GGUF holds, tensor by tensor, and the `model_id` that names it.

A manifest lists the architecture and hyperparameters, and for each tensor its name, ggml type,
shape, absolute byte offset and length in the file, the sha256 of its bytes and the layer it
belongs to (None for `token_embd`, `output_norm`, `output`); plus the sha256 of the header bytes
and a digest of the tokenizer and chat-template metadata. Peers verify fetched tensors against it,
and `model_id` (sha256 of the manifest's canonical serialization) names the model in DHT keys,
sessions and artifacts.

Canonical serialization: JSON with sorted keys, no whitespace, ASCII only (a subset of RFC 8785
sufficient here because every value is a string, an integer, a bool, a finite float or a list).

This module reads local files only; it does not fetch anything.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

from swarm.errors import ModelError, ProtocolError
from swarm.models import cache_dir, check_gguf

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20
"""Bound on a manifest received from a peer (SmolLM2's is ~60 KB; 10,000 tensors fit easily)."""

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
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
        n_layers, n_embd, n_vocab: block count, hidden size, vocabulary size.
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

        Raises:
            ProtocolError: oversized, not canonical JSON of this version, bad fields, or a hash
                that does not match `expected_model_id`.
        """
        if len(data) > MAX_MANIFEST_BYTES:
            raise ProtocolError(f"manifest of {len(data)} bytes exceeds {MAX_MANIFEST_BYTES}")
        if expected_model_id is not None and hashlib.sha256(data).hexdigest() != expected_model_id:
            raise ProtocolError(f"manifest does not hash to model_id {expected_model_id[:16]}...")
        try:
            body = json.loads(data)
            if body.pop("version") != MANIFEST_VERSION:
                raise ValueError("unknown manifest version")
            tensors = tuple(TensorInfo(**{**t, "shape": tuple(t["shape"])}) for t in body.pop("tensors"))
            manifest = cls(**body, tensors=tensors)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ProtocolError(f"malformed manifest: {e}") from e
        if manifest.to_bytes() != data:
            raise ProtocolError("manifest is not in canonical form")
        return manifest

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
        """Tensors of blocks [start, end), global half-open indices, in file order."""
        return tuple(t for t in self.tensors if t.layer is not None and start <= t.layer < end)


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
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
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

    Raises:
        ModelError: missing file, not GGUF, or a GGUF the `gguf` package cannot parse.
    """
    path = check_gguf(Path(path))
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise ModelError(f"cannot parse GGUF {path}: {e}") from e
    fields = {
        name: _field_value(field) for name, field in reader.fields.items() if not name.startswith("GGUF.")
    }
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path}: no general.architecture in GGUF metadata")
    try:
        n_layers = int(fields[f"{arch}.block_count"])
        n_embd = int(fields[f"{arch}.embedding_length"])
    except KeyError as e:
        raise ModelError(f"{path}: missing metadata key {e.args[0]}") from e
    tokens = fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else int(fields.get(f"{arch}.vocab_size", 0))

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
    return Manifest(
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


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
