"""Split GGUFs (llama.cpp's `<name>-00001-of-0000N.gguf` shards) as one model: a merged GGUF.

Large models are published as shards carrying llama.cpp's `split.no`, `split.count` and
`split.tensors.count` keys; the first shard holds all the metadata (hparams, tokenizer) and every
shard a run of the tensors. Swarm treats a split model as the one GGUF that llama.cpp's
`llama-gguf-split --merge` would make of it: the first shard's metadata less the `split.*` keys,
then every shard's tensors in shard order. The merged file is written once into the model cache
(`<cache>/merged/<key>/<name>.gguf`, `key` from the shards' paths, sizes and mtimes) and is then
the model everywhere: its manifest, model_id, torrent, seeding, span fetching and slicing are
those of a single file. Its bytes depend only on the shards' contents, so every peer that merges
the same shards gets the same model_id.

This module reads and writes local files only; it does not touch the swarm.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.gguf_raw import RawArrayWriter, add_raw_tensor, read_array

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
_SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_ALIGNMENT_KEY = "general.alignment"


def shard_path(first: Path, no: int, count: int) -> Path:
    """Path of shard `no` (0-based) of a split model, named as llama.cpp's `llama_split_path` names it.

    Args:
        first: any shard's path (its directory and `<prefix>-` are kept).
        no, count: 0 <= no < count.
    Raises:
        ModelError: `first` is not named `<prefix>-NNNNN-of-MMMMM.gguf`.
    """
    m = _SHARD_NAME.match(first.name)
    if m is None:
        raise ModelError(f"{first}: a split GGUF shard must be named <prefix>-NNNNN-of-MMMMM.gguf")
    return first.with_name(f"{m.group('prefix')}-{no + 1:05d}-of-{count:05d}.gguf")


def split_shards(path: Path) -> list[Path] | None:
    """The shards of the split model whose first shard is `path`, in order; None for a whole GGUF.

    Reads each shard's header only (`scan`).

    Raises:
        ModelError: `path` is a shard other than the first (the message names the first), a shard
            is missing (the message names it), or a shard's `split.*` keys disagree with its name
            or the first shard's.
    """
    scalars = scan(path).scalars
    count = scalars.get(SPLIT_COUNT, 1)
    no = scalars.get(SPLIT_NO, 0)
    if not isinstance(count, int) or not isinstance(no, int) or not 0 <= no < max(count, 1):
        raise ModelError(f"{path}: bad split keys ({SPLIT_NO}={no!r}, {SPLIT_COUNT}={count!r})")
    if count <= 1:
        return None
    if no != 0:
        raise ModelError(f"{path} is shard {no + 1} of {count} of a split model: "
                         f"give its first shard, {shard_path(path, 0, count)}")
    shards = [shard_path(path, i, count) for i in range(count)]
    if shards[0].name != path.name:
        raise ModelError(f"{path}: shard 1 of {count} must be named {shards[0].name}")
    missing = [s for s in shards if not s.is_file()]
    if missing:
        raise ModelError(f"split model {path} is missing shard(s): {', '.join(map(str, missing))}")
    for i, shard in enumerate(shards[1:], 1):
        got = scan(shard).scalars
        if got.get(SPLIT_NO) != i or got.get(SPLIT_COUNT) != count:
            raise ModelError(f"{shard}: its split keys say shard {got.get(SPLIT_NO)!r} of "
                             f"{got.get(SPLIT_COUNT)!r}, expected shard {i} of {count} (0-based)")
    return shards


def merged_model(path: Path, cache: Path, progress: bool = False) -> Path:
    """`path` itself for a whole GGUF; for the first shard of a split model, its merged GGUF.

    The merged file is written atomically (temp + rename) under `cache/merged/` on first use and
    reused while the shards are unchanged.

    Args:
        path: a GGUF (already checked for the magic).
        cache: the model cache directory.
        progress: show the merge's progress bar on stderr.
    Returns:
        the GGUF to use as the model.
    Raises:
        ModelError: as `split_shards`, or shards whose tensor count differs from the first
            shard's `split.tensors.count`, or that the `gguf` package cannot read.
    """
    shards = split_shards(path)
    if shards is None:
        return path
    stamp = hashlib.sha256()
    for s in shards:
        st = s.stat()
        stamp.update(os.fsencode(s.resolve()) + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    prefix = _SHARD_NAME.match(path.name).group("prefix")
    dest = cache / "merged" / stamp.hexdigest()[:16] / f"{prefix}.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{prefix}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if progress:
            print(f"merging the {len(shards)} shards of {path} into {dest}", file=sys.stderr)
        _merge(shards, tmp, progress)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise ModelError(f"cannot merge split model {path}: {type(e).__name__}: {str(e)[:200]}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _merge(shards: list[Path], out: Path, progress: bool) -> None:
    headers = [scan(s) for s in shards]
    first = headers[0]
    arch = str(first.scalars["general.architecture"])
    want = first.scalars[SPLIT_TENSORS_COUNT]
    have = sum(len(h.tensors) for h in headers)
    if have != want:
        raise ModelError(f"{shards[0]}: the shards hold {have} tensors; {SPLIT_TENSORS_COUNT} says {want}")
    writer = RawArrayWriter(out, arch)
    for key, vtype in first.value_types.items():
        if key.startswith("split.") or key == "general.architecture":
            continue
        if key == _ALIGNMENT_KEY:
            writer.data_alignment = int(first.scalars[key])
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, read_array(shards[0], first, key), GGUFValueType.ARRAY,
                                 sub_type=GGUFValueType(first.array_types[key]))
        else:
            writer.add_key_value(key, first.scalars[key], GGUFValueType(vtype))
    for shard, header in zip(shards, headers):
        data = np.memmap(shard, dtype=np.uint8, mode="r")
        for name, entry in header.tensors.items():
            # raw bytes unchanged; the map is read only when the file is written
            add_raw_tensor(writer, name, data, entry)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=progress)
    writer.close()
