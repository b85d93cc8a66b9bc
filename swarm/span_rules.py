"""Which layer spans of a model llama.cpp can run exactly (pure): a row's split rules on metadata.

An architecture's row (`swarm.arch`) names its split rules with reasons: where a span may start
(`cut_constraint`), span lengths llama.cpp would take for another model variant
(`refused_span_lengths`), and spans that must mix two kinds of layers (`mixed_span`). Whether a
given span breaks them depends on the model's own metadata (per-layer arrays, or llama.cpp's
derivation by layer index when the file lists none). This module evaluates them on a metadata
mapping, so the same answer serves slicing (metadata read from the GGUF header) and placement
(metadata from the manifest's `hparams`, before any byte of the model is on disk).

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swarm.arch import ArchRow, LayerTable, SwaPattern


def legal_starts(row: ArchRow, meta: Mapping[str, Any], n_layers: int) -> list[int]:
    """Global layer indices where a span may start (always includes 0).

    Args:
        row: the model's architecture row.
        meta: GGUF metadata, key → value (arrays as sequences); only `<arch>.*` keys are read.
        n_layers: the model's block count.
    """
    cc = row.cut_constraint
    if cc is None:
        return list(range(n_layers))
    values = meta.get(f"{row.name}.{cc.key_suffix}")
    if not isinstance(values, (list, tuple)):
        tables = (d for d in row.derived_layer_keys if isinstance(d, LayerTable))
        table = next((d for d in tables if d.key_suffix == cc.key_suffix), None)
        ctx = meta.get(f"{row.name}.context_length")
        values = table.values(n_layers, int(ctx or 0)) if table is not None else [1] * n_layers
    return [0] + [il for il in range(1, n_layers) if values[il]]


def pattern_flags(row: ArchRow, pat: SwaPattern, meta: Mapping[str, Any], n_layers: int) -> list[bool]:
    """Per-layer flags of a whole model: the explicit array if the metadata has one, else derived
    by llama.cpp's rule (`SwaPattern.flags`)."""
    explicit = meta.get(f"{row.name}.{pat.array_key_suffix or pat.key_suffix}")
    if isinstance(explicit, (list, tuple)):
        return [bool(v) for v in explicit]
    period = meta.get(f"{row.name}.{pat.key_suffix}")
    return pat.flags(n_layers, int(period) if period is not None else pat.default_period)


def span_refusal(row: ArchRow, meta: Mapping[str, Any], start: int, end: int, n_layers: int) -> str | None:
    """Why llama.cpp could not run span [start, end) of this model exactly, or None when it can.

    Args:
        row, meta, n_layers: as for `legal_starts`.
        start, end: global layers, half-open, inside [0, n_layers).
    Returns:
        None, or a one-line reason naming the span and the row's rule.
    """
    if row.cut_constraint is not None and start not in legal_starts(row, meta, n_layers):
        return f"span [{start}, {end}) cannot start at layer {start}: {row.cut_constraint.reason}"
    variant_keys = all(f"{row.name}.{k}" in meta for k, _ in row.default_keys)
    if end - start in row.refused_span_lengths and variant_keys:
        return f"span [{start}, {end}) of {end - start} layers: {row.span_length_reason}"
    if row.mixed_span is not None:
        flags = pattern_flags(row, row.mixed_span.pattern, meta, n_layers)[start:end]
        if all(flags) or not any(flags):
            return f"span [{start}, {end}) holds layers of one kind only: {row.mixed_span.reason}"
    return None


def has_split_rules(row: ArchRow) -> bool:
    """Whether any span of this row's models can be refused (placement can skip the check otherwise)."""
    return row.cut_constraint is not None or bool(row.refused_span_lengths) or row.mixed_span is not None
