"""The `swarm` command line: argument parsing and output only; the work lives in the packages.

Every `SwarmError` becomes one line on stderr and exit status 1; argument errors exit 2.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

from swarm.errors import SwarmError
from swarm.models import DEFAULT_MODEL, KNOWN_MODELS
from swarm.netaddr import NetConfig


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `swarm` console script. Returns the process exit status."""
    # Read by libgomp when it loads, so set before any command imports llama.cpp: spinning OpenMP
    # threads of one peer starve co-located peers' compute (shared NOTES: 0.47x vs 0.81-0.87x).
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A path that is not UTF-8 (argv decodes its bytes to surrogates) prints back as its bytes.
        sys.stdout.reconfigure(errors="surrogateescape")
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
    p = argparse.ArgumentParser(
        prog="swarm", description="Serve and use GGUF language models split across peers."
    )
    sub = p.add_subparsers(metavar="COMMAND")

    models = sub.add_parser("models", help="list, fetch and inspect models").add_subparsers(metavar="ACTION")
    m = models.add_parser("list", help="known models and whether they are fetched")
    m.add_argument(
        "--cache-dir", help="model cache directory (default $SWARM_MODELS or ~/.cache/swarm/models)"
    )
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
    c.add_argument(
        "--initial-peers", nargs="*", default=[], metavar="MADDR", help="swarm peers to join through"
    )
    c.add_argument("--prompt", help="answer this one prompt and exit")
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=None, help="compute threads (--local)")
    c.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    c.add_argument(
        "--json", action="store_true", help="one-shot: print text and telemetry as one JSON object"
    )
    c.set_defaults(func=_chat)

    s = sub.add_parser("serve", help="serve a span of a model's layers to the swarm")
    s.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="NAME or PATH (seeded whole), or a MODEL_ID (only the span is fetched from the swarm)",
    )
    s.add_argument(
        "--layers",
        type=_layers,
        default=None,
        metavar="A:B",
        help="global layers [A, B) to serve (default: the span that most raises the swarm's routable "
        "throughput and fits --memory; re-evaluated every --rebalance-period)",
    )
    s.add_argument(
        "--memory",
        type=_byte_size,
        default=None,
        metavar="SIZE",
        help="memory for the span's weights and KV cache when --layers is not given, e.g. 2GiB "
        "(default: half of the memory available now)",
    )
    s.add_argument(
        "--max-layers",
        type=_positive,
        default=None,
        help="cap on the span's length when --layers is not given",
    )
    s.add_argument(
        "--rebalance-period",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="re-evaluate a chosen span this often and move (after draining) when the swarm gains "
        ">= 20%% routable throughput; 0: never (default 600)",
    )
    _add_peer_args(s, bittorrent=True)
    s.add_argument("--new-swarm", action="store_true", help="start a new swarm (no --initial-peers)")
    s.add_argument(
        "--max-sessions", type=int, default=8, help="sessions open at once, each with a KV stream of its own"
    )
    s.add_argument(
        "--cache-tokens", type=int, default=16384,
        help="KV-cache tokens in all; each session holds at most cache-tokens / max-sessions of them "
        "(rounded up to a multiple of 256; 2,048 with the defaults), its longest prompt + generation",
    )
    s.add_argument("--threads", type=int, default=1, help="llama.cpp compute threads")
    s.add_argument("--announce-period", type=float, default=30.0, help="seconds between DHT refreshes")
    s.add_argument("--public-name", default=None)
    s.add_argument(
        "--prefix-cache-bytes",
        type=int,
        default=256 << 20,
        help="memory for prefix KV snapshots, reused by sessions that share a prompt prefix (0: none)",
    )
    s.add_argument(
        "--prefix-disk-bytes",
        type=int,
        default=0,
        help="disk for prefix snapshots evicted from memory, under the data dir (default 0: none)",
    )
    s.add_argument("--debug-tamper-snapshots", default=None, help=argparse.SUPPRESS)
    s.add_argument("--debug-die-after-pushes", type=int, default=0, help=argparse.SUPPRESS)
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on --host:PORT")
    direct = s.add_mutually_exclusive_group()
    direct.add_argument(
        "--direct-port",
        type=int,
        default=0,
        help="TCP port on --host for direct span streams from clients, set up and authenticated over "
        "libp2p (0: any free port; behind a NAT, forward it and give a fixed one)",
    )
    direct.add_argument(
        "--no-direct", action="store_true", help="offer no direct streams: clients use libp2p streams only"
    )
    s.add_argument("--inline-max-ms", type=float, default=None, help=argparse.SUPPRESS)  # benchmarks
    s.set_defaults(func=_serve)

    d = sub.add_parser("dht", help="run a DHT-only peer and print the multiaddrs others join with")
    _add_peer_args(d)
    d.set_defaults(func=_dht)

    pb = sub.add_parser(
        "publish", help="seed a model file to the swarm and publish its manifest (foreground)"
    )
    pb.add_argument("model", metavar="NAME|PATH")
    _add_peer_args(pb, bittorrent=True)
    pb.add_argument("--new-swarm", action="store_true", help="start a new swarm (no --initial-peers)")
    pb.set_defaults(func=_publish)

    dm = sub.add_parser(
        "demo", help="start a local swarm (a first peer + span peers), answer a prompt, stop it"
    )
    dm.add_argument("--model", default=DEFAULT_MODEL, help="NAME or PATH")
    dm.add_argument("--spans", type=_positive, default=3, help="serving peers, each with a contiguous span")
    dm.add_argument("--prompt", default="Name three planets of the solar system.")
    dm.add_argument("--max-new-tokens", type=int, default=64)
    dm.add_argument("--json", action="store_true", help="print text and telemetry as one JSON object")
    dm.set_defaults(func=_demo)

    st = sub.add_parser(
        "status",
        help="peers serving a model, whether their spans chain into a route, dead ends; "
        "exit status 3 when no complete route exists",
    )
    st.add_argument("--model", default=DEFAULT_MODEL, help="NAME, PATH or MODEL_ID of the model")
    st.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)

    ap = sub.add_parser("api", help="OpenAI-compatible HTTP API and health page for a model on the swarm")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"NAME, PATH or MODEL_ID ({DEFAULT_MODEL})")
    ap.add_argument("--local", action="store_true", help="run the whole model in this process")
    ap.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR", help="peers to join through")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP listen address, an IP literal")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: any free port)")
    ap.add_argument("--threads", type=int, default=None, help="compute threads (--local)")
    ap.add_argument("--status-period", type=float, default=2.0, help="seconds between health-page reads")
    ap.set_defaults(func=_api)
    return p


def _api(args) -> None:
    from swarm.api.server import ApiConfig, run_api

    if not args.local and not args.initial_peers:
        raise SwarmError("pass --initial-peers MADDR to serve the swarm's model, or --local")
    run_api(
        ApiConfig(
            model=args.model,
            local=args.local,
            initial_peers=tuple(args.initial_peers),
            host=args.host,
            port=args.port,
            n_threads=args.threads,
            status_period_s=args.status_period,
        )
    )


def _add_peer_args(p: argparse.ArgumentParser, bittorrent: bool = False) -> None:
    p.add_argument(
        "--initial-peers", nargs="*", default=[], metavar="MADDR", help="peers to join the DHT through"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="listen address, an IPv4 or IPv6 literal (default 127.0.0.1); 0.0.0.0 or :: listens on "
        "every interface and advertises each interface address",
    )
    p.add_argument("--port", type=int, default=0, help="libp2p listen port (0: any free port)")
    if bittorrent:
        p.add_argument(
            "--bt-port",
            type=int,
            default=0,
            help="BitTorrent listen port for model bytes (0: any free port, the same on every interface)",
        )
    p.add_argument(
        "--public-address",
        default=None,
        metavar="IP",
        help="advertise only this address (e.g. a NAT's public IP forwarding --port"
        + (" and --bt-port" if bittorrent else "")
        + " here); needs a fixed --port",
    )
    p.add_argument("--data-dir", default=None, help="peer identity directory (default $SWARM_HOME)")


def _net(args) -> NetConfig:
    bt_port = getattr(args, "bt_port", 0)
    return NetConfig(host=args.host, port=args.port, bt_port=bt_port, public_address=args.public_address)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _byte_size(text: str) -> int:
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MiB or 4GB, got {text!r}") from None


def _default_memory() -> int:
    """Half of the memory available now (Linux), else 4 GiB."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _layers(text: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B with integers, got {text!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"need 0 <= A < B, got {text!r}")
    return a, b


def _serve(args) -> None:
    from swarm.peer.server import ServeConfig, serve_forever

    _check_swarm_choice(args)
    serve_forever(
        ServeConfig(
            model=args.model,
            layers=args.layers,
            initial_peers=tuple(args.initial_peers),
            host=args.host,
            port=args.port,
            bt_port=args.bt_port,
            public_address=args.public_address,
            data_dir=args.data_dir,
            max_sessions=args.max_sessions,
            cache_tokens=args.cache_tokens,
            n_threads=args.threads,
            memory_bytes=args.memory if args.memory is not None else _default_memory(),
            max_layers=args.max_layers,
            announce_period_s=args.announce_period,
            public_name=args.public_name,
            rebalance_period_s=args.rebalance_period,
            prefix_cache_bytes=args.prefix_cache_bytes,
            prefix_disk_bytes=args.prefix_disk_bytes,
            debug_tamper_snapshots=args.debug_tamper_snapshots,
            debug_die_after_pushes=args.debug_die_after_pushes,
            metrics_port=args.metrics_port,
            direct_port=None if args.no_direct else args.direct_port,
            **({} if args.inline_max_ms is None else {"inline_max_ms": args.inline_max_ms}),
        )
    )


def _check_swarm_choice(args) -> None:
    if bool(args.initial_peers) == bool(args.new_swarm):
        raise SwarmError("pass either --initial-peers MADDR to join a swarm, or --new-swarm to start one")


def _publish(args) -> None:
    from swarm.artifacts.publisher import run_publisher

    _check_swarm_choice(args)
    run_publisher(args.model, args.initial_peers, _net(args), args.data_dir)


def _dht(args) -> None:
    from swarm.dht.node import run_dht_only

    run_dht_only(args.initial_peers, args.host, args.port, args.data_dir, args.public_address)


def _demo(args) -> int:
    import tempfile
    from pathlib import Path

    from swarm.client.api import Client
    from swarm.localswarm import start_local_swarm
    from swarm.manifest import build_manifest
    from swarm.models import resolve_model

    path = resolve_model(args.model, progress=True)
    n_layers = build_manifest(path).n_layers
    with tempfile.TemporaryDirectory(prefix="swarm-demo-") as root:
        print(
            f"starting a local swarm: a first peer + {args.spans} peers serving {n_layers} layers",
            file=sys.stderr,
        )
        peers = start_local_swarm(Path(root), path, n_layers, args.spans)
        try:
            for p in peers.started[1:]:
                print(f"  peer {p.peer_id[:16]}… ready", file=sys.stderr)
            print(f"prompt: {args.prompt}", file=sys.stderr)
            with Client(str(path), initial_peers=peers.started[0].maddrs) as client:
                stream = client.chat_stream(
                    [{"role": "user", "content": args.prompt}], max_new_tokens=args.max_new_tokens
                )
                result = _print_stream(stream, args.json)
            if not args.json:
                print(result.telemetry.summary(), file=sys.stderr)
        finally:
            peers.stop_all()
    return 0


NO_ROUTE_EXIT = 3
"""`swarm status` exit status when no chain of spans joins the first layer to the last."""


def _status(args) -> int:
    from swarm.client.status import swarm_status

    report = swarm_status(args.model, args.initial_peers)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        report.print_table()
    return 0 if report.chains.complete else NO_ROUTE_EXIT


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


def _chat(args) -> int:
    from swarm.client.api import Client
    from swarm.errors import RequestError
    from swarm.limits import MAX_CONTEXT_TOKENS
    from swarm.sampling import SamplingParams

    sampling = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    # Bad values fail here, before a model loads or a DHT node starts; the engine checks them again.
    SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    if args.max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be >= 1 (got {args.max_new_tokens})")
    if args.max_new_tokens >= MAX_CONTEXT_TOKENS:
        raise RequestError(
            f"max_new_tokens ({args.max_new_tokens}) exceeds the product's hard cap of "
            f"{MAX_CONTEXT_TOKENS} tokens per session (prompt included)"
        )
    if args.prompt is not None:
        _check_prompt(args.prompt)
    client = Client(args.model, local=args.local, initial_peers=args.initial_peers, n_threads=args.threads)
    try:
        if args.prompt is not None:
            return _one_shot(client, args, sampling)
        return _repl(client, sampling)
    finally:
        client.close()


def _check_prompt(prompt: str) -> None:
    """Refuse an empty prompt, or one with bytes that were not UTF-8 (argv decodes them to surrogates)."""
    from swarm.client.text import check_utf8
    from swarm.errors import RequestError

    if not check_utf8(prompt, "--prompt").strip():
        raise RequestError("empty prompt")


def _one_shot(client, args, sampling: dict) -> int:
    if args.raw:
        stream = client.stream(args.prompt, **sampling)
    else:
        stream = client.chat_stream([{"role": "user", "content": args.prompt}], **sampling)
    _print_stream(stream, args.json)
    return 0


def _print_stream(stream, as_json: bool):
    """Print a generation: its deltas as they come (to a terminal or a pipe, so a generation that
    fails part-way still leaves its text so far), then a newline; or, with `as_json`, one JSON
    object at the end."""
    for delta in stream:
        if not as_json:
            print(delta, end="", flush=True)
    result = stream.result
    if as_json:
        print(json.dumps({"text": result.text, "telemetry": result.telemetry.to_dict()}, ensure_ascii=False))
    else:
        print()
    return result


def _repl(client, sampling: dict) -> int:
    """Chat until /quit, end of input, or two Ctrl-C in a row at the prompt.

    Ctrl-C during an answer stops it, closes its stream (and so its sessions) and drops the turn:
    neither the question nor the half answer stays in the history.
    """
    print(
        "swarm chat: type a message; /stats shows the last telemetry, /reset clears history, /quit exits.",
        file=sys.stderr,
    )
    if isinstance(sys.stdin, io.TextIOWrapper):
        # A line that is not UTF-8 then reaches the tokenizer's check (one error line, the REPL goes
        # on) instead of raising UnicodeDecodeError out of input().
        sys.stdin.reconfigure(errors="surrogateescape")
    history: list[dict] = []
    last = None
    prompt_interrupts = 0  # consecutive Ctrl-C at the prompt
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            prompt_interrupts += 1
            print(file=sys.stderr)
            if prompt_interrupts >= 2:
                return 0
            print("(Ctrl-C again or /quit to exit)", file=sys.stderr)
            continue
        prompt_interrupts = 0
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
        stream = None
        try:
            stream = client.chat_stream(history, **sampling)
            for delta in stream:
                print(delta, end="", flush=True)
            print()
        except SwarmError as e:
            history.pop()
            print(f"swarm: error: {e}", file=sys.stderr)
            continue
        except KeyboardInterrupt:
            if stream is not None:
                stream.close()
            history.pop()
            print(flush=True)
            print("[interrupted: this turn is dropped from the history]", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": stream.result.text})
        last = stream.result.telemetry


if __name__ == "__main__":
    sys.exit(main())
