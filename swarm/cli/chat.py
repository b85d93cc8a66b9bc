"""`swarm chat`: answer one prompt (`--prompt`) or chat in a REPL, on the swarm or `--local`.

`print_stream` (a generation's deltas as they come, or one JSON object) is shared with `swarm demo`.
"""

from __future__ import annotations

import io
import json
import sys

from swarm.errors import SwarmError
from swarm.models import DEFAULT_MODEL


def register(sub) -> None:
    """Add `chat` to the `swarm` subparsers `sub`."""
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
    c.add_argument("--threads", type=int, default=None, help="prompt threads (--local; each generated token runs on 1)")
    c.add_argument("--speculate", type=int, default=0, metavar="K",
                   help="speculative decoding with up to K drafted tokens per pass (swarm only; same text)")
    c.add_argument("--draft", default="lookup", metavar="DRAFT",
                   help="with --speculate: where the guesses come from: lookup (prompt lookup, the "
                        "default), mtp (the model's own multi-token-prediction head, on the last peer), "
                        "self (the model requantized to Q3_K_M, run here), self:TYPE, or "
                        "the path of a draft .gguf with the model's tokenizer")
    c.add_argument("--fixed-k", action="store_true",
                   help="with --speculate: always draft up to K, instead of the K (0 included) that the "
                        "measured acceptance and pass times say is fastest")
    c.add_argument("--one-pass", action="store_true",
                   help="with --speculate: one verify pass in flight at a time, instead of sending the "
                        "next pass before the last one is back where it is likely to be used")
    c.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    c.add_argument(
        "--json", action="store_true", help="one-shot: print text and telemetry as one JSON object"
    )
    c.set_defaults(func=_chat)


def _chat(args) -> int:
    from swarm.client.api import Client
    from swarm.errors import RequestError
    from swarm.limits import MAX_CONTEXT_TOKENS, MAX_VERIFY_ROWS
    from swarm.sampling import SamplingParams

    sampling = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        speculate=args.speculate,
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
    if not 0 <= args.speculate < MAX_VERIFY_ROWS:
        raise RequestError(f"--speculate must be in [0, {MAX_VERIFY_ROWS - 1}], got {args.speculate}")
    if args.speculate and args.local:
        raise RequestError("--speculate runs on the swarm: speculative decoding saves round trips "
                           "over the route")
    if args.draft != "lookup" and not args.speculate:
        raise RequestError("--draft chooses the guesses of --speculate: give --speculate K too")
    if args.prompt is not None:
        _check_prompt(args.prompt)
    client = Client(args.model, local=args.local, initial_peers=args.initial_peers, n_threads=args.threads,
                    adaptive_speculation=not args.fixed_k, pipeline_speculation=not args.one_pass,
                    draft=args.draft)
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
    print_stream(stream, args.json)
    return 0


def print_stream(stream, as_json: bool):
    """Print a generation: its deltas as they come (to a terminal or a pipe, so a generation that
    fails part-way still leaves its text so far), redrawn after a correction (`show`), then a
    newline; or, with `as_json`, one JSON object at the end (the repaired text)."""
    if as_json:
        for _ in stream:
            pass
    else:
        show(stream)
    result = stream.result
    if as_json:
        print(json.dumps({"text": result.text, "telemetry": result.telemetry.to_dict()}, ensure_ascii=False))
    else:
        print()
    return result


REDRAWN = "[swarm: a peer was caught computing wrong and the text changed; the answer is redrawn below]"


def show(stream) -> None:
    """Print a stream's text deltas as they come. After a `Correction` (a peer was caught computing
    wrong, and the text already printed changed; the stream yields none when the repaired text is
    the same) the answer is redrawn: a note on stderr, then on a new line the text that stands,
    which the deltas that follow continue. A terminal's printed lines cannot be taken back portably
    (wrapped lines, wide characters), so the redraw starts below them."""
    from swarm.client.generate import Correction

    shown = ""
    for item in stream:
        if isinstance(item, Correction):
            shown = shown[: item.position]
            print(flush=True)
            print(REDRAWN, file=sys.stderr, flush=True)
            print(shown, end="", flush=True)
        else:
            shown += item
            print(item, end="", flush=True)


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
            show(stream)
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
