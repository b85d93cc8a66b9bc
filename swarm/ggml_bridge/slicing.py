"""Build the GGUF a peer loads to run layers [start, end) of a model on unmodified llama.cpp.

The span file holds blocks start..end-1 renumbered from 0, `<arch>.block_count = end - start`, and
every metadata key of the source with per-layer arrays cut to the span. Only the final span
(end == n_layers) carries the vocabulary and the output head; other spans carry a one-token dummy
vocabulary and a one-row dummy `token_embd`, so llama.cpp does not compute a full lm_head on every
peer. Spans take hidden states as input (the client embeds tokens), so no span needs the real
embedding table except a final span whose head is tied to it.

Reading goes through `gguf.GGUFReader`, which memory-maps the source: only the header and the
byte ranges of the copied tensors are read, so a sparse, partially downloaded copy of the GGUF
works as long as the span's tensors are present.

This module runs nothing and does not download anything.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.gguf_reader import ReaderField

from swarm.arch import ArchRow, arch_row
from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import scan

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_HEAD_TENSORS = ("output.weight", "output.bias")
_EMBD_TENSOR = "token_embd.weight"
SPAN_START_KEY = "swarm.span.start"
SPAN_END_KEY = "swarm.span.end"
SPAN_N_LAYERS_KEY = "swarm.span.n_layers"


def default_cache_dir() -> Path:
    """Where span files are cached: `$SWARM_HOME/spans`, else `~/.cache/swarm/spans`."""
    home = os.environ.get("SWARM_HOME")
    if home:
        return Path(home).expanduser() / "spans"
    return Path.home() / ".cache" / "swarm" / "spans"


def file_identity(model_path: Path) -> str:
    """A cache identity for a model file when no manifest id is given.

    Returns:
        hex sha256 of (resolved path, size in bytes, mtime in ns); changes when the file does.
    """
    st = model_path.stat()
    text = f"{model_path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()


def read_span_layers(model_path: Path) -> tuple[str, int]:
    """Architecture name and block count of a GGUF (whole model or span file); reads the header only.

    Raises:
        ModelError: unreadable file or missing `general.architecture` / `<arch>.block_count`.
    """
    scalars = scan(model_path).scalars
    arch = scalars.get("general.architecture")
    n_layers = scalars.get(f"{arch}.block_count")
    if not isinstance(arch, str) or not isinstance(n_layers, int):
        raise ModelError(f"{model_path}: GGUF metadata lacks general.architecture or <arch>.block_count")
    return arch, n_layers


def build_span(model_path: Path, start: int, end: int, cache_dir: Path | None = None,
               model_id: str | None = None) -> Path:
    """Write (or reuse from the cache) the GGUF holding layers [start, end) of `model_path`.

    Args:
        model_path: the whole model's GGUF; may be sparse (only header + this span's tensors present).
        start, end: global layer indices, half-open; 0 <= start < end <= n_layers.
        cache_dir: where span files live; default `default_cache_dir()`.
        model_id: the manifest's model id; default `file_identity(model_path)`.
    Returns:
        path `<cache_dir>/<model_id[:16]>-<start>-<end>.gguf`, written atomically (temp + rename).
    Raises:
        ValueError: start/end out of range.
        ModelError: the source is not a readable GGUF.
        UnsupportedArchitecture: the source's architecture has no row in `swarm.arch`.
    """
    arch, n_layers = read_span_layers(model_path)
    row = arch_row(arch)
    if not (0 <= start < end <= n_layers):
        raise ValueError(f"span [{start}, {end}) is not inside the model's {n_layers} layers "
                         f"(need 0 <= start < end <= {n_layers})")
    ident = model_id or file_identity(model_path)
    out_dir = cache_dir or default_cache_dir()
    dest = out_dir / f"{ident[:16]}-{start}-{end}.gguf"
    if dest.exists():
        return dest
    reader = _open(model_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".part", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = GGUFWriter(tmp, arch)
        is_last = end == n_layers
        _copy_metadata(reader, writer, row, start, end, n_layers, is_last)
        _copy_tensors(reader, writer, start, end, is_last)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _open(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path, "r")
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read GGUF {path}: {e}") from e


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter, row: ArchRow, start: int, end: int,
                   n_layers: int, is_last: bool) -> None:
    arch = row.name
    prefix = f"{arch}."
    per_layer = {prefix + k for k in row.per_layer_keys}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if not is_last and key.startswith("tokenizer."):
            continue
        if not is_last and key == f"{arch}.vocab_size":
            continue
        if key == f"{arch}.block_count":
            writer.add_uint32(key, end - start)
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = field.types[-1]
            values = field.contents()
            if key.startswith(prefix) and (key in per_layer or len(values) == n_layers):
                if len(values) != n_layers:
                    raise ModelError(f"per-layer key {key} has {len(values)} values for {n_layers} layers")
                values = values[start:end]
            writer.add_key_value(key, values, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, field.contents(), vtype)
    _write_swa_pattern(reader, writer, row, start, end, n_layers)
    if not is_last:
        writer.add_string("tokenizer.ggml.model", "no_vocab")
        writer.add_uint32(f"{arch}.vocab_size", 1)
    writer.add_uint32(SPAN_START_KEY, start)
    writer.add_uint32(SPAN_END_KEY, end)
    writer.add_uint32(SPAN_N_LAYERS_KEY, n_layers)


def _write_swa_pattern(reader: GGUFReader, writer: GGUFWriter, row: ArchRow, start: int, end: int,
                       n_layers: int) -> None:
    """Write the sliding-window flags explicitly when the source leaves llama.cpp to derive them."""
    pat = row.swa_pattern
    if pat is None:
        return
    window: ReaderField | None = reader.fields.get(f"{row.name}.{pat.window_key_suffix}")
    if window is None or window.contents() <= 0:
        return
    key = f"{row.name}.{pat.key_suffix}"
    field = reader.fields.get(key)
    if field is not None and field.types[0] == GGUFValueType.ARRAY:
        return  # already per layer: cut by _copy_metadata
    period = int(field.contents()) if field is not None else pat.default_period
    flags = pat.flags(n_layers, period)[start:end]
    writer.add_key_value(key, flags, GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)


def _copy_tensors(reader: GGUFReader, writer: GGUFWriter, start: int, end: int, is_last: bool) -> None:
    n_embd = None
    for t in reader.tensors:
        m = _BLOCK_RE.match(t.name)
        if m:
            layer = int(m.group(1))
            if start <= layer < end:
                _add_raw(writer, f"blk.{layer - start}.{m.group(2)}", t)
            continue
        if t.name == _EMBD_TENSOR:
            n_embd = int(t.shape[0])
            if is_last:
                _add_raw(writer, t.name, t)
            else:
                writer.add_tensor(t.name, np.zeros((1, n_embd), dtype=np.float32))
            continue
        if t.name in _HEAD_TENSORS and not is_last:
            continue
        _add_raw(writer, t.name, t)
    if n_embd is None:
        raise ModelError(f"GGUF has no {_EMBD_TENSOR}")


def _add_raw(writer: GGUFWriter, name: str, t) -> None:
    """Copy a tensor's bytes unchanged (the memmap is read only when the file is written)."""
    writer.add_tensor(name, t.data, raw_dtype=t.tensor_type)
