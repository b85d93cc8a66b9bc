"""One client stream on a peer: the session loop of the span protocol (swarm/wire.py).

A stream carries one session from `Open` to `Close`: the handler admits it into the span
(swarm/peer/span.py), then answers each `Forward` with `Hidden` (or `Token` on the last span, which
samples; a verify pass of speculative decoding, `Forward.verify`, gets one sampled token per row),
each with the receipt of the rows it computed (`swarm.wire.receipt`), applies `Truncate` and `Chain`,
and releases the session when the stream ends for any reason. A Forward's token ids
(`Forward.token_ids`) go to the span with its rows; a span whose layers read them refuses a step
without them. A bad frame or bad request gets an `Error` frame; request errors keep the session open,
protocol errors end this stream only. Other sessions never notice. Which Open is refused, and in
what order, is `swarm.peer.rules.open_refusal`.

Executor work goes through the span's `StepScheduler` (swarm/peer/scheduler.py): decode steps of
different sessions that wait together run as one batch, a long prefill is cut into 64-row chunks
with other sessions' decode steps between them, and each unit runs on the event loop thread or the
span's executor thread by its measured cost. A Forward frame carries at most MAX_FORWARD_TOKENS rows.

Prefix snapshots (swarm/peer/snapshots.py): an `Open` may offer prefix hashes; the peer answers
which lengths it can restore (`OpenOk.restorable`). A first `Forward` with `restore` imports the
snapshot into the session's sequence and truncates it to that length before computing its rows;
a prefill that reaches the whole offered prompt is exported and kept as a new snapshot.

Server push (a `Chain`, pushed Forwards, the push streams from the previous hop) is
swarm/peer/push.py; pushed frames run here, through `handle_push`.

Limits per remote client (swarm/peer/quotas.py): every span and push stream is counted against its
remote peer and against the peer's cap on streams, and every frame's bytes are reserved from its
length prefix before its body is read (waiting while the peer's byte budget is full); a stream or a
frame past a limit is answered BUSY with the limit's name, and the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from swarm.errors import Busy, ExecutorError, ProtocolError, RequestError, SwarmError
from swarm.kv.prefix import owner_scoped
from swarm.kv.sessions import SessionSlot
from swarm.p2p import FrameGate, FrameRefused, FramedStream
from swarm.peer import rules
from swarm.peer.quotas import WAIT, ClientLedger, ClientLimits
from swarm.peer.push import OPEN_TIMEOUT_S, Dial, PushState, send_error, serve_push
from swarm.peer.scheduler import StepOutput
from swarm.peer.span import Span
from swarm.peer.testlie import LOGIT_NOISE_SCALE, Liar
from swarm.sampling import SamplingParams, sample
from swarm.spec.verify import accepted
from swarm.wire import (
    Chain,
    Close,
    Error,
    ErrorCode,
    Forward,
    Hidden,
    Open,
    OpenOk,
    Token,
    Truncate,
    decode_frame,
    encode_frame,
    receipt,
)

logger = logging.getLogger(__name__)


@dataclass
class PeerStreams:
    """The streams of one served span: what every stream handler shares besides the span.

    Attributes:
        span: the served span.
        idle_timeout_s: a stream that sends nothing for this long is closed and its session freed.
        dial: opens push streams to next hops; None: this peer pushes nowhere.
        after_push: test hook called after each push, before the client's copy is sent.
        open: live stream handlers' streams, so shutdown can tell their clients.
        live: open sessions by session id (push streams find theirs here).
        liar: TEST ONLY (`SWARM_TEST_LIE`, swarm/peer/testlie.py): corrupts the hidden states
            answered and pushed; None on every normal peer.
        ledger: streams and frame bytes in flight per remote peer, and their caps.
    """

    span: Span
    idle_timeout_s: float = 600.0
    dial: Dial | None = None
    after_push: Callable[[], None] | None = None
    open: set = field(default_factory=set)
    live: dict[bytes, _Session] = field(default_factory=dict)
    liar: Liar | None = None
    ledger: ClientLedger = field(default_factory=lambda: ClientLedger(ClientLimits()))
    _room: set[asyncio.Future] = field(default_factory=set, init=False, repr=False)

    def gate(self, client: str) -> FrameGate:
        """The `swarm.p2p.FrameGate` of a stream from `client`: reserves each frame's bytes in the
        ledger before its body is read, waiting while only the peer's budget is short."""
        ledger = self.ledger

        def release(n_bytes: int) -> None:
            ledger.release(client, n_bytes)
            for fut in self._room:  # wake every waiter; each asks the ledger again
                if not fut.done():
                    fut.set_result(None)

        async def reserve(n_bytes: int) -> Callable[[], None]:
            while (verdict := ledger.reserve(client, n_bytes)) == WAIT:
                fut = asyncio.get_running_loop().create_future()
                self._room.add(fut)
                try:
                    await fut
                finally:
                    self._room.discard(fut)
            if verdict is not None:
                raise FrameRefused(verdict)
            return lambda: release(n_bytes)

        return reserve


async def _counted(streams: PeerStreams, stream: FramedStream, serve: Callable) -> None:
    """Run `serve()` for `stream` as one of its remote peer's streams, under the ledger's caps: a
    stream past a cap, or a frame past a byte budget, is answered BUSY with the limit."""
    client = stream.remote_peer_id
    refusal = streams.ledger.open_stream(client)
    if refusal is not None:
        await send_error(stream, ErrorCode.BUSY, refusal)
        await stream.linger_close()
        return
    stream.set_gate(streams.gate(client))
    try:
        await serve()
    except FrameRefused as e:
        await send_error(stream, ErrorCode.BUSY, str(e))
    finally:
        # after an Error, a plain close could reset the stream before the client reads why (the
        # refused frame's body may still be arriving, too); either gives back the frame's bytes
        await (stream.linger_close() if stream.sent_last else stream.close())
        streams.ledger.close_stream(client)


@dataclass
class _Prefixes:
    """One session's prefix offers and what this peer can restore of them (n → snapshot hash)."""

    offers: tuple[tuple[int, bytes], ...]
    restorable: dict[int, bytes]
    kept: bool = False


@dataclass(eq=False)
class _Session:
    """One open session on this span: its slot, its client's stream, and its place in a push chain.

    `lock` is held around each frame's work, so frames from the client stream and pushed frames
    (from the previous hop) run one at a time, in arrival order."""

    slot: SessionSlot
    sampling: SamplingParams
    prefixes: _Prefixes
    client: FramedStream
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    push: PushState = field(default_factory=PushState)


async def handle_stream(streams: PeerStreams, stream: FramedStream) -> None:
    """Serve one client stream until Close, disconnect, idle timeout or shutdown."""
    await _counted(streams, stream, lambda: _serve_stream(streams, stream))


async def _serve_stream(streams: PeerStreams, stream: FramedStream) -> None:
    streams.open.add(stream)
    session: _Session | None = None
    try:
        opened = await _open(streams.span, stream)
        if opened is None:
            return
        session = _Session(*opened, client=stream)
        streams.live[session.slot.session_id] = session
        while True:
            data = await stream.recv(streams.idle_timeout_s)  # idle past the timeout: PeerUnreachable ends it
            try:
                frame = decode_frame(data)
            except ProtocolError as e:
                await send_error(stream, ErrorCode.PROTOCOL, str(e))
                return
            if isinstance(frame, Close):
                return
            async with session.lock:
                await _answer(streams, session, frame)
    finally:
        streams.open.discard(stream)
        if session is not None:
            streams.live.pop(session.slot.session_id, None)
            await session.push.end()
            async with session.lock:  # a pushed frame may be running on the session
                await streams.span.release(session.slot.session_id, owner=session.slot.owner)


async def handle_push(streams: PeerStreams, stream: FramedStream) -> None:
    """Serve one push stream from the previous hop of a chained session (`swarm.peer.push.serve_push`)."""
    await _counted(streams, stream, lambda: serve_push(stream, streams.live, streams.idle_timeout_s,
                                                       lambda session, frame: _answer(streams, session, frame)))


async def _answer(streams: PeerStreams, session: _Session, frame) -> None:
    """Run one frame on the session (lock held) and answer the client; push onward when asked."""
    try:
        reply = await _dispatch(streams, session, frame)
    except (RequestError, ExecutorError) as e:
        reply = Error(ErrorCode.BAD_REQUEST, str(e))
    try:
        await session.client.send(encode_frame(reply))
    except SwarmError:
        pass  # the client is gone: its stream's handler ends the session


async def _open(span: Span, stream: FramedStream) -> tuple[SessionSlot, SamplingParams, _Prefixes] | None:
    """Read the stream's Open, admit its session and answer OpenOk; None when refused (answered)."""
    data = await stream.recv(OPEN_TIMEOUT_S)
    try:
        frame = decode_frame(data)
    except ProtocolError as e:
        await send_error(stream, ErrorCode.PROTOCOL, str(e))
        return None
    if not isinstance(frame, Open):
        await send_error(stream, ErrorCode.PROTOCOL, f"first frame must be open, got {type(frame).__name__}")
        return None
    refusal = rules.open_refusal(
        frame, stream.remote_peer_id, shutting_down=span.shutting_down, draining=span.drain.active,
        model_id=span.model_id, start=span.start, end=span.end,
    )
    if refusal is not None:
        await send_error(stream, *refusal)
        return None
    try:
        slot = await span.admit(frame.session_id, stream.remote_peer_id, frame.max_tokens, time.monotonic())
    except Busy as e:
        await send_error(stream, ErrorCode.BUSY, str(e))
        return None
    except RequestError as e:
        await send_error(stream, ErrorCode.BAD_REQUEST, str(e))
        return None
    prefixes, fetched_from = _Prefixes(owner_scoped(frame.prefixes, stream.remote_peer_id), {}), ""
    if frame.prefixes and span.prefixes is not None:
        prefixes.restorable, fetched = await span.prefixes.prepare(prefixes.offers)
        fetched_from = fetched.peer_id if fetched is not None else ""
    restorable = rules.restorable_lengths(frame.prefixes, prefixes.restorable)
    ok = OpenOk(reserved_tokens=slot.reserved_tokens, restorable=restorable, fetched_from=fetched_from,
                verify_rows=span.verify_rows)
    await stream.send(encode_frame(ok))
    return slot, frame.sampling, prefixes


async def _dispatch(streams: PeerStreams, session: _Session, frame):
    span, slot, prefixes = streams.span, session.slot, session.prefixes
    if isinstance(frame, Forward):
        why = rules.forward_size_refusal(frame.n_tokens)
        if why is not None:
            raise RequestError(why)
        if rules.rewinds(frame.pos0, frame.rewind, slot.pos):
            await span.truncate(slot, frame.pos0)
        # a verify pass samples every row on the last span, so it needs every row's logits
        all_logits = (frame.want_logits and frame.all_logits) or (frame.verify and span.is_last)
        restore = (frame.restore, prefixes.restorable.get(frame.restore)) if frame.restore else None
        push = _PushOn(streams, session, frame) if frame.push and not span.is_last else None
        reply = await span.forward(slot, frame.pos0, frame.hidden, all_logits=all_logits, steps=frame.steps,
                                   finish=lambda out: _reply(span, frame, out, session.sampling, streams.liar,
                                                             pushed=push is not None and push.pushed),
                                   then=push, restore=restore, token_ids=frame.token_ids, verify=frame.verify)
        if frame.want_draft and isinstance(reply, Token) and span.has_mtp:
            t0 = time.perf_counter()
            reply = replace(reply, draft=await _draft(span, slot, frame, reply))
            reply = replace(reply, compute_ms=reply.compute_ms + (time.perf_counter() - t0) * 1000.0)
        if span.prefixes is not None and rules.keeps_prefix(prefixes.offers, prefixes.kept, slot.pos):
            prefixes.kept = True  # the whole offered prompt is in the cache: keep it once
            await span.keep_prefix(slot, prefixes.offers)
        return reply
    if isinstance(frame, Truncate):
        await span.truncate(slot, frame.pos)
        return OpenOk(reserved_tokens=slot.reserved_tokens)
    if isinstance(frame, Chain):
        await session.push.chain(frame, span.is_last, streams.dial)
        return OpenOk(reserved_tokens=slot.reserved_tokens)
    raise RequestError(f"unexpected {type(frame).__name__} frame in an open session")


async def _draft(span: Span, slot: SessionSlot, frame: Forward, reply: Token) -> tuple[int, ...]:
    """The head's drafts (`frame.want_draft` at most) of the tokens after the one the session's next
    step feeds (`Token.draft`). After a verify pass that is the token sampled after its accepted rows
    (`accepted`: the fed tokens against the sampled ones), so a pass whose guesses are rejected still
    brings the next ones. A draft the head cannot make (a pass longer than it remembers, no KV cell
    left for the draft position) is answered as none: the step itself was computed, and the client
    then decodes plainly."""
    token, pos = reply.token, None
    if frame.verify and frame.token_ids.shape[0] == len(reply.tokens):
        new = accepted(frame.token_ids[1:].tolist(), reply.tokens)
        token, pos = new[-1], frame.pos0 + len(new)
    try:
        return await span.mtp_draft(slot, token, frame.want_draft, pos)
    except ExecutorError as e:
        logger.info("no MTP draft for session %s: %s", slot.seq_id, e)
        return ()


@dataclass
class _PushOn:
    """A chained step's push (`Forward.push`): sends the step's output to the next hop the moment it
    is computed (`Span.forward`'s `then`), before this peer builds its answer to the client, so that
    answer's work (receipt, frame, session bookkeeping) overlaps the next hop's compute. A test
    liar pushes the rows it answers (its noise depends on the position only), or with `transit`
    other rows."""

    streams: PeerStreams
    session: _Session
    frame: Forward
    pushed: bool = False
    """Whether the output went on (`PushState.send`), once called."""

    async def __call__(self, out: np.ndarray) -> None:
        liar, frame = self.streams.liar, self.frame
        sent = out if liar is None else liar.in_transit(liar.corrupt(out, frame.pos0, frame.steps))
        self.pushed = await self.session.push.send(frame, sent, self.streams.after_push)


def _reply(span: Span, frame: Forward, r: StepOutput, sampling: SamplingParams,
           liar: Liar | None = None, pushed: bool = False) -> Hidden | Token:
    """The answer to a computed Forward: its hidden states (`pushed`: they went on to the next hop
    too), or on the last span the sampled token (a test liar's corrupted hidden states, or tokens
    sampled from corrupted logits, instead: swarm/peer/testlie.py).

    Raises:
        RequestError: the logits cannot be sampled (`swarm.sampling.sample`).
    """
    if not span.is_last:
        out = r.out if liar is None else liar.corrupt(r.out, frame.pos0, frame.steps)
        return Hidden(step=frame.step, hidden=out, compute_ms=r.compute_ms, pushed=pushed,
                      receipt=receipt(frame.hidden, frame.token_ids))
    t0 = time.perf_counter()
    scored = r.out if liar is None or not liar.every else liar.corrupt(r.out, frame.pos0, frame.steps,
                                                                      LOGIT_NOISE_SCALE)
    s = sample(scored[-1], sampling, position=frame.pos0 + frame.n_tokens)
    tokens: tuple[int, ...] = ()
    if frame.verify:  # row i as the decode step at position pos0 + i would sample it (swarm/spec/verify.py)
        tokens = tuple(sample(row, sampling, position=frame.pos0 + i + 1).token
                       for i, row in enumerate(scored[:-1])) + (s.token,)
    logits = None
    if frame.want_logits:
        logits = scored if frame.all_logits else scored[-1:]
    return Token(
        step=frame.step,
        token=s.token,
        logprob=s.logprob,
        top=s.top,
        compute_ms=r.compute_ms + (time.perf_counter() - t0) * 1000.0,
        logits=logits,
        tokens=tokens,
        receipt=receipt(frame.hidden, frame.token_ids),
    )
