"""The metadata of a span file: every key of the source model, with what a layer range changes.

Per-layer arrays are cut to the span's blocks (and keep the MTP blocks' entries where the final span
keeps those blocks and the source has a value per block of the file); arrays llama.cpp derives from
a layer's index in the file (sliding-window and recurrent flags, GLM's indexer table) are written
explicitly, since the span's indices are not the model's; counts of leading layers are shifted; a
span that needs no vocabulary gets a one-token dummy one; the span's place in the model is recorded
(`SPAN_START_KEY`, `SPAN_END_KEY`, `SPAN_N_LAYERS_KEY`).

This module writes keys into a `GGUFWriter` and reads nothing but the header it is given and the
arrays it copies; swarm.ggml_bridge.slicing builds the file around it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFValueType, GGUFWriter

from swarm import span_rules
from swarm.arch import MTP_LAYERS_KEY, ArchRow, LayerTable, SwaPattern
from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import GGUFHeader
from swarm.ggml_bridge.gguf_raw import read_array

SPAN_START_KEY = "swarm.span.start"
SPAN_END_KEY = "swarm.span.end"
SPAN_N_LAYERS_KEY = "swarm.span.n_layers"


def copy_metadata(path: Path, header: GGUFHeader, writer: GGUFWriter, row: ArchRow, start: int,
                   end: int, n_layers: int, keep_mtp: int, is_last: bool, meta: dict[str, Any]) -> None:
    """Metadata of span [start, end): per-layer arrays cut to the span's blocks, then, where the
    source has a value per block of the file (MTP blocks included), its `keep_mtp` MTP blocks'
    values; the MTP key only where the span keeps them. Other arrays (the vocabulary) are copied as
    their raw bytes.

    llama.cpp reads some per-layer arrays for every block of the file (`n_layer_all`: deepseek4's
    compress_ratios) and others for the trunk only (`n_layer()`: glm-dsa's indexer types), and
    refuses any other length; a known per-layer key of the source keeps its kind in the span."""
    arch = row.name
    prefix = f"{arch}."
    per_layer = {prefix + k for k in (*row.per_layer_keys, *map(_derived_key, row.derived_layer_keys))}
    leading = {prefix + k for k in row.leading_count_keys}
    n_blocks = int(header.scalars[f"{arch}.block_count"])
    dropped = set() if keep_mtp else {prefix + MTP_LAYERS_KEY}
    no_window = _windows_unused(header, meta, row, start, end, n_layers)
    # a span that reads token ids validates them against its vocabulary (and indexes tables by them)
    keeps_vocab = is_last or reads_token_ids(row, meta, start)
    for key, vtype in header.value_types.items():
        if key == "general.architecture" or key in dropped:
            continue
        if key in no_window:
            # no layer of the span uses the window: llama.cpp asserts is_swa_any() when a model has
            # a window but no window layer, so the span says "no window" (same graph for its layers)
            writer.add_uint32(key, 0)
            continue
        if key in leading:
            # counts the model's first layers of a kind: in the span file they are the first
            # max(0, v - start) blocks (llama.cpp compares the file's block index with it)
            writer.add_uint32(key, min(max(int(header.scalars[key]) - start, 0), end - start))
            continue
        if not keeps_vocab and key.startswith("tokenizer."):
            continue
        if not keeps_vocab and key == f"{arch}.vocab_size":
            continue
        if key == f"{arch}.block_count":
            writer.add_uint32(key, end - start + keep_mtp)
            continue
        if vtype != GGUFValueType.ARRAY:
            writer.add_key_value(key, header.scalars[key], GGUFValueType(vtype))
            continue
        sub = GGUFValueType(header.array_types[key])
        length = header.array_lengths[key]
        if key.startswith(prefix) and (key in per_layer or length == n_blocks):
            if length not in (n_blocks, n_layers):
                raise ModelError(f"per-layer key {key} has {length} values for {n_blocks} blocks")
            values = header.small_arrays.get(key) or list(read_array(path, header, key))
            mtp_values = values[n_layers:n_layers + keep_mtp] if length == n_blocks else []
            writer.add_key_value(key, values[start:end] + mtp_values, GGUFValueType.ARRAY, sub_type=sub)
        else:
            writer.add_key_value(key, read_array(path, header, key), GGUFValueType.ARRAY, sub_type=sub)
    for pat in (row.swa_pattern, *row.derived_layer_keys):
        if pat is not None:
            _write_derived(header, writer, row.name, pat, start, end, n_layers, keep_mtp)
    for suffix, value in row.default_keys:
        if f"{arch}.{suffix}" not in header.value_types:
            writer.add_uint32(f"{arch}.{suffix}", value)
    if not keeps_vocab:
        writer.add_string("tokenizer.ggml.model", "no_vocab")
        writer.add_uint32(f"{arch}.vocab_size", 1)
    if row.residual_input:
        writer.add_bool(f"{arch}.residual_input", True)
    writer.add_uint32(SPAN_START_KEY, start)
    writer.add_uint32(SPAN_END_KEY, end)
    writer.add_uint32(SPAN_N_LAYERS_KEY, n_layers)


def _positive_scalar(header: GGUFHeader, key: str) -> bool:
    value = header.scalars.get(key)
    return isinstance(value, (int, float)) and value > 0


def _windows_unused(header: GGUFHeader, meta: dict[str, Any], row: ArchRow, start: int, end: int,
                    n_layers: int) -> set[str]:
    """Window keys (`<arch>.<window_key_suffix>`) of patterns none of whose span layers is flagged."""
    out = set()
    for pat in (row.swa_pattern, *row.derived_layer_keys):
        if not isinstance(pat, SwaPattern) or pat.window_key_suffix is None:
            continue
        key = f"{row.name}.{pat.window_key_suffix}"
        if not _positive_scalar(header, key):
            continue
        flags = span_rules.pattern_flags(row, pat, meta, n_layers)[start:end]
        if not any(flags):
            out.add(key)
    return out


def _derived_key(pat: SwaPattern | LayerTable) -> str:
    """The key suffix of the per-layer array `pat` stands for."""
    if isinstance(pat, LayerTable):
        return pat.key_suffix
    return pat.array_key_suffix or pat.key_suffix


def _write_derived(header: GGUFHeader, writer: GGUFWriter, arch: str, pat: SwaPattern | LayerTable,
                   start: int, end: int, n_layers: int, keep_mtp: int) -> None:
    """Write a per-layer array explicitly when the source leaves llama.cpp to derive it by index.

    A table (glm-dsa's indexer types) is read for the trunk's layers only; flags (qwen35's recurrent
    layers, gemma3's windows) for every block of the file, so the span's `keep_mtp` MTP blocks get
    False (llama.cpp's qwen35 loader: an MTP block is a plain attention block)."""
    if isinstance(pat, LayerTable):
        key = f"{arch}.{pat.key_suffix}"
        if key in header.value_types:
            return  # already per layer: cut by copy_metadata
        ctx = int(header.scalars.get(f"{arch}.context_length", 0))
        values = pat.values(n_layers, ctx)[start:end]
        writer.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
        return
    # (a span none of whose layers uses the window has it set to 0; the flags are harmless)
    if pat.window_key_suffix is not None and not _positive_scalar(header, f"{arch}.{pat.window_key_suffix}"):
        return
    key = f"{arch}.{pat.key_suffix}"
    array_key = f"{arch}.{pat.array_key_suffix}" if pat.array_key_suffix else key
    if header.value_types.get(array_key) == GGUFValueType.ARRAY:
        return  # already per layer: cut by copy_metadata
    period = int(header.scalars[key]) if key in header.scalars else pat.default_period
    flags = pat.flags(n_layers, period)[start:end] + [False] * keep_mtp
    writer.add_key_value(array_key, flags, GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)


def reads_token_ids(row: ArchRow, meta: dict[str, Any], start: int) -> bool:
    """Span [start, ...) holds a layer that reads token ids (a `token_ids` sideband's leading layers)."""
    return any(sb.name == "token_ids" and
               (sb.when_key is None or int(meta.get(f"{row.name}.{sb.when_key}", 0)) > start)
               for sb in row.sidebands)
