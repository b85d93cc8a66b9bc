"""`swarm models list|fetch|info`: the known models, fetching one, a model's manifest summary."""

from __future__ import annotations

import json

from swarm.models import DEFAULT_MODEL, KNOWN_MODELS


def register(sub) -> None:
    """Add `models` and its actions to the `swarm` subparsers `sub`."""
    models = sub.add_parser("models", help="list, fetch and inspect models").add_subparsers(metavar="ACTION")
    m = models.add_parser("list", help="known models and whether they are fetched")
    m.add_argument(
        "--cache-dir", help="model cache directory (default $SWARM_MODELS or ~/.cache/swarm/models)"
    )
    m.set_defaults(func=_list)
    m = models.add_parser("fetch", help="download, assemble and verify a known model")
    m.add_argument("name", choices=sorted(KNOWN_MODELS), metavar="NAME")
    m.add_argument("--cache-dir")
    m.set_defaults(func=_fetch)
    m = models.add_parser("info", help="manifest summary and model_id of a model")
    m.add_argument("model", metavar="NAME|PATH")
    m.add_argument("--cache-dir")
    m.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    m.set_defaults(func=_info)


def _list(args) -> None:
    from swarm.models import cached_path

    for name, model in KNOWN_MODELS.items():
        fetched = "fetched" if cached_path(model, args.cache_dir).exists() else "-"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<22} {model.size_bytes / 2**20:7.1f} MiB  {fetched:<8} {model.description}{default}")


def _fetch(args) -> None:
    from swarm.models import fetch_model

    print(fetch_model(args.name, cache=args.cache_dir, progress=True))


def _info(args) -> None:
    from swarm.manifest import build_manifest
    from swarm.models import resolve_model

    path = resolve_model(args.model, cache=args.cache_dir, fetch=False)
    manifest = build_manifest(path)
    if args.json:
        print(json.dumps({"model_id": manifest.model_id, **json.loads(manifest.to_bytes())}))
        return
    print(f"path           {path}")
    print(f"model_id       {manifest.model_id}")
    print(f"architecture   {manifest.arch}")
    print(f"layers         {manifest.n_layers}")
    print(f"hidden         {manifest.n_embd}")
    print(f"vocabulary     {manifest.n_vocab}")
    print(f"tensors        {len(manifest.tensors)}")
    print(f"file size      {manifest.file_size} bytes")
    print(f"tokenizer      sha256 {manifest.tokenizer_sha256}")
