"""The `swarm` command line: argument parsing and output only; the work lives in the packages.

Every `SwarmError` becomes one line on stderr and exit status 1; argument errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from swarm.errors import SwarmError
from swarm.models import DEFAULT_MODEL, KNOWN_MODELS


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `swarm` console script. Returns the process exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args) or 0
    except SwarmError as e:
        print(f"swarm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarm", description="Serve and use GGUF language models split across peers.")
    sub = p.add_subparsers(metavar="COMMAND")

    models = sub.add_parser("models", help="list, fetch and inspect models").add_subparsers(metavar="ACTION")
    m = models.add_parser("list", help="known models and whether they are fetched")
    m.add_argument("--cache-dir", help="model cache directory (default $SWARM_MODELS or ~/.cache/swarm/models)")
    m.set_defaults(func=_models_list)
    m = models.add_parser("fetch", help="download, assemble and verify a known model")
    m.add_argument("name", choices=sorted(KNOWN_MODELS), metavar="NAME")
    m.add_argument("--cache-dir")
    m.set_defaults(func=_models_fetch)
    m = models.add_parser("info", help="manifest summary and model_id of a model")
    m.add_argument("model", metavar="NAME|PATH")
    m.add_argument("--cache-dir")
    m.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    m.set_defaults(func=_models_info)

    c = sub.add_parser("chat", help="chat with a model (on the swarm, or --local)")
    c.add_argument("--model", default=DEFAULT_MODEL, help=f"NAME, PATH or model_id (default {DEFAULT_MODEL})")
    c.add_argument("--local", action="store_true", help="run the whole model in this process")
    c.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR", help="swarm peers to join through")
    c.add_argument("--prompt", help="answer this one prompt and exit")
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=None, help="compute threads (--local)")
    c.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    c.add_argument("--json", action="store_true", help="one-shot: print text and telemetry as one JSON object")
    c.set_defaults(func=_chat)
    return p


def _models_list(args) -> None:
    from swarm.models import cached_path

    for name, model in KNOWN_MODELS.items():
        fetched = "fetched" if cached_path(model, args.cache_dir).exists() else "-"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<22} {model.size_bytes / 2**20:7.1f} MiB  {fetched:<8} {model.description}{default}")


def _models_fetch(args) -> None:
    from swarm.models import fetch_model

    print(fetch_model(args.name, cache=args.cache_dir, progress=True))


def _models_info(args) -> None:
    from swarm.manifest import build_manifest
    from swarm.models import resolve_model

    path = resolve_model(args.model, cache=args.cache_dir, progress=True)
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


def _chat(args) -> int:
    from swarm.client.api import Client

    client = Client(args.model, local=args.local, initial_peers=args.initial_peers, n_threads=args.threads)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    top_k=args.top_k, seed=args.seed)
    try:
        if args.prompt is not None:
            return _one_shot(client, args, sampling)
        return _repl(client, sampling)
    finally:
        client.close()


def _one_shot(client, args, sampling: dict) -> int:
    if not args.prompt.strip():
        from swarm.errors import RequestError

        raise RequestError("empty prompt")
    if args.raw:
        stream = client.stream(args.prompt, **sampling)
    else:
        stream = client.chat_stream([{"role": "user", "content": args.prompt}], **sampling)
    live = sys.stdout.isatty() and not args.json
    for delta in stream:
        if live:
            print(delta, end="", flush=True)
    result = stream.result
    if args.json:
        print(json.dumps({"text": result.text, "telemetry": result.telemetry.to_dict()}, ensure_ascii=False))
    elif live:
        print()
    else:
        print(result.text)
    return 0


def _repl(client, sampling: dict) -> int:
    print("swarm chat: type a message; /stats shows the last telemetry, /reset clears history, /quit exits.",
          file=sys.stderr)
    history: list[dict] = []
    last = None
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/stats":
            print(last.summary() if last else "no generation yet", file=sys.stderr)
            continue
        if text == "/reset":
            history.clear()
            continue
        history.append({"role": "user", "content": text})
        try:
            stream = client.chat_stream(history, **sampling)
            for delta in stream:
                print(delta, end="", flush=True)
            print()
        except SwarmError as e:
            history.pop()
            print(f"swarm: error: {e}", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": stream.result.text})
        last = stream.result.telemetry


if __name__ == "__main__":
    sys.exit(main())
