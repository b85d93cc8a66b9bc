"""Build the GGUF a peer loads to run layers [start, end) of a model on unmodified llama.cpp.

The span file holds blocks start..end-1 renumbered from 0, `<arch>.block_count = end - start`, and
every metadata key of the source with per-layer arrays cut to the span (swarm.ggml_bridge.span_metadata).
Only the final span (end == n_layers) carries the vocabulary and the output head; other spans carry
a one-token dummy vocabulary and a one-row dummy `token_embd`, so llama.cpp does not compute a full
lm_head on every peer. Spans take hidden states as input (the client embeds tokens), so no span needs the real
embedding table except a final span whose head is tied to it.

Multi-token-prediction (MTP) blocks: llama.cpp stores them after the last layer and counts them in
`<arch>.block_count` (`<arch>.nextn_predict_layers` of them), so a model has block_count - nextn
layers (`read_span_layers`). Where the row serves the head (`ArchRow.mtp_head`) the final span's
file keeps them, renumbered after its own blocks, with the key and their entries of per-layer arrays
(and `token_embd`, which the head embeds its tokens with, when the block has no
`nextn.embed_tokens`); other spans drop them. Other rows refuse such a GGUF.

Reading goes through the bounded header scan (`gguf_header`) and a memory map of the source: only
the header and the byte ranges of the copied tensors are read, so a sparse, partially downloaded
copy of the GGUF works as long as the span's tensors are present. Arrays other than per-layer ones
(the vocabulary) are copied as raw bytes (`gguf_raw`): `gguf.GGUFReader` took 13-25 s per span to
materialise a 151k- or 262k-token vocabulary.

This module runs nothing and does not download anything.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from swarm.arch import MTP_LAYERS_KEY, ArchRow, arch_row
from swarm.errors import ModelError
from swarm import span_rules
from swarm.ggml_bridge.gguf_header import GGUFHeader, scan
from swarm.ggml_bridge.gguf_raw import RawArrayWriter, add_raw_tensor, tensor_bytes
from swarm.ggml_bridge.span_metadata import copy_metadata, reads_token_ids

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_HEAD_TENSORS = ("output.weight", "output.bias")
_EMBD_TENSOR = "token_embd.weight"


def default_cache_dir() -> Path:
    """Where span files are cached: `$SWARM_SPAN_CACHE`, else `$SWARM_HOME/spans`, else
    `~/.cache/swarm/spans`. Several peers may share one (files are written atomically, named by
    model id and span)."""
    shared = os.environ.get("SWARM_SPAN_CACHE")
    if shared:
        return Path(shared).expanduser()
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
    """Architecture name and layer count of a GGUF (whole model or span file): its block count less
    its multi-token-prediction blocks (`mtp_layers`); reads the header only.

    Raises:
        ModelError: unreadable file, missing `general.architecture` / `<arch>.block_count`, or an
            MTP count that leaves no layer.
    """
    arch, n_layers, _ = _layer_counts(model_path)
    return arch, n_layers


def mtp_layers(model_path: Path) -> int:
    """Multi-token-prediction blocks of a GGUF (`<arch>.nextn_predict_layers`, 0 when absent), stored
    after its layers; a span file holds them only when it is a model's final span serving the head.

    Raises:
        ModelError: as `read_span_layers`.
    """
    return _layer_counts(model_path)[2]


def _layer_counts(model_path: Path) -> tuple[str, int, int]:
    """(arch, layers, MTP blocks) from the header; block_count = layers + MTP blocks."""
    scalars = scan(model_path).scalars
    arch = scalars.get("general.architecture")
    n_blocks = scalars.get(f"{arch}.block_count")
    if not isinstance(arch, str) or not isinstance(n_blocks, int):
        raise ModelError(f"{model_path}: GGUF metadata lacks general.architecture or <arch>.block_count")
    n_mtp = scalars.get(f"{arch}.{MTP_LAYERS_KEY}", 0)
    if not isinstance(n_mtp, int) or isinstance(n_mtp, bool) or not 0 <= n_mtp < n_blocks:
        raise ModelError(f"{model_path}: {arch}.{MTP_LAYERS_KEY} = {n_mtp!r} does not leave a layer of "
                         f"{arch}.block_count = {n_blocks}")
    return arch, n_blocks - n_mtp, n_mtp


def legal_starts(model_path: Path) -> list[int]:
    """Global layer indices where a span of this model may start (always includes 0).

    Reads the header only. Without a `cut_constraint` in the architecture's row every layer is legal.

    Raises:
        ModelError: unreadable GGUF; UnsupportedArchitecture: no row.
    """
    arch, n_layers = read_span_layers(model_path)
    return span_rules.legal_starts(arch_row(arch), arch_metadata(scan(model_path), arch), n_layers)


def arch_metadata(header: GGUFHeader, arch: str) -> dict[str, Any]:
    """The `<arch>.*` metadata of a GGUF, key → value (numeric arrays of at most SMALL_ARRAY_LEN
    elements as lists; longer ones and string arrays left out): what `swarm.span_rules` reads.
    From the fast header scan: `gguf.GGUFReader` takes seconds on a large vocabulary."""
    prefix = f"{arch}."
    fields = {**header.scalars, **header.small_arrays}
    return {k: v for k, v in fields.items() if k.startswith(prefix)}


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
    _refuse_span(model_path, row, start, end, n_layers)
    ident = model_id or file_identity(model_path)
    out_dir = cache_dir or default_cache_dir()
    dest = out_dir / f"{ident[:16]}-{start}-{end}.gguf"
    if dest.exists():
        return dest
    header = scan(model_path)
    n_mtp = mtp_layers(model_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".part", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = RawArrayWriter(tmp, arch)
        is_last = end == n_layers
        meta = arch_metadata(header, arch)
        keep_mtp = n_mtp if is_last else 0  # only the final span serves the head (_refuse_span)
        copy_metadata(model_path, header, writer, row, start, end, n_layers, keep_mtp, is_last, meta)
        data = _map(model_path)
        _copy_tensors(header, data, writer, start, end, n_layers, keep_mtp, is_last, row.residual_input)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _refuse_span(model_path: Path, row: ArchRow, start: int, end: int, n_layers: int) -> None:
    """Raise when llama.cpp could not run span [start, end) of this model exactly (reasons in the row).

    Raises:
        ValueError: the span breaks the row's cut constraint, refused lengths or mixed-span rule.
        ModelError: the GGUF carries multi-token-prediction blocks its row does not serve.
    """
    arch = row.name
    header = scan(model_path)
    n_mtp = mtp_layers(model_path)
    if n_mtp and not row.mtp_head:
        raise ModelError(f"{model_path}: the GGUF carries {n_mtp} multi-token-prediction block(s) "
                         f"({arch}.{MTP_LAYERS_KEY}); llama.cpp has no MTP head for {arch}; serve a "
                         "trunk-only conversion")
    meta = arch_metadata(header, arch)
    for suffix in row.mtp_zero_keys if n_mtp else ():
        values = meta.get(f"{arch}.{suffix}")
        if isinstance(values, list) and any(values[n_layers:]):
            raise ModelError(f"{model_path}: {arch}.{suffix} is {values[n_layers:]} for the "
                             f"multi-token-prediction block(s); llama.cpp builds their graph only for 0")
    why = span_rules.span_refusal(row, meta, start, end, n_layers)
    if why is not None:
        raise ValueError(why)


def _map(path: Path) -> np.memmap:
    """The whole file as read-only uint8 (a sparse copy maps too: only copied tensors are read)."""
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read GGUF {path}: {e}") from e


def span_has_mtp(span_path: Path) -> bool:
    """True when the span file holds multi-token-prediction blocks (a final span of a model whose row
    serves the head): its executor runs the head too.

    Raises:
        ModelError: unreadable GGUF.
    """
    return mtp_layers(span_path) > 0


def span_reads_token_ids(span_path: Path) -> bool:
    """True when the span file's layers read token ids, so every step it runs must carry them.

    Raises:
        ModelError: unreadable GGUF. UnsupportedArchitecture: no row for its architecture.
    """
    header = scan(span_path)
    arch = str(header.scalars.get("general.architecture", ""))
    row = arch_row(arch)
    # in a span file the leading counts are already cut to the span: layers from 0 read them
    return reads_token_ids(row, arch_metadata(header, arch), 0)


def _copy_tensors(header: GGUFHeader, data: np.memmap, writer: GGUFWriter, start: int, end: int,
                  n_layers: int, keep_mtp: int, is_last: bool, residual_input: bool) -> None:
    """Tensors of span [start, end): its blocks renumbered from 0, then `keep_mtp` MTP blocks (the
    source's blocks n_layers.. renumbered from end - start), and the global tensors."""
    n_embd = None
    names = header.tensors.keys()
    has_head = _HEAD_TENSORS[0] in names
    # llama.cpp's MTP graph embeds its tokens with the block's own table, else with token_embd
    mtp_embeds = keep_mtp > 0 and any(f"blk.{n_layers + k}.nextn.embed_tokens.weight" not in names
                                      for k in range(keep_mtp))
    for name, t in header.tensors.items():
        m = _BLOCK_RE.match(name)
        if m:
            layer = int(m.group(1))
            if start <= layer < end:
                add_raw_tensor(writer, f"blk.{layer - start}.{m.group(2)}", data, t)
            elif n_layers <= layer < n_layers + keep_mtp:
                add_raw_tensor(writer, f"blk.{layer - n_layers + end - start}.{m.group(2)}", data, t)
            continue
        if name == _EMBD_TENSOR:
            n_embd = int(t.dims[0])
            if mtp_embeds:
                add_raw_tensor(writer, name, data, t)  # the MTP head reads it (the span's input does not)
                continue
            if residual_input and has_head:
                continue  # the patched loader needs no embedding table in a span (ArchRow.residual_input)
            if is_last and not has_head:
                add_raw_tensor(writer, name, data, t)  # tied head: the embedding table is the head
            elif is_last:
                # llama.cpp requires token_embd [n_embd, n_vocab] but a span never reads it (hidden
                # states come in): zeros of the same type (all-zero blocks decode to 0 in every ggml
                # type), so no unfetched, unverified source byte enters the span file
                writer.add_tensor(name, np.zeros_like(tensor_bytes(data, t)),
                                  raw_dtype=GGMLQuantizationType(t.ggml_type))
            else:
                writer.add_tensor(name, np.zeros((1, n_embd), dtype=np.float32))
            continue
        if name in _HEAD_TENSORS and not is_last:
            continue
        add_raw_tensor(writer, name, data, t)
    if n_embd is None:
        raise ModelError(f"GGUF has no {_EMBD_TENSOR}")
