"""One client stream on a peer: the session loop of the span protocol (swarm/wire.py), and the push
streams that feed a chained session from the previous hop's peer.

A stream carries one session from `Open` to `Close`: the handler admits it into the span's
`SessionTable`, then answers each `Forward` with `Hidden` (or `Token` on the last span, which
samples), applies `Truncate`, and releases the session's KV cache when the stream ends for any
reason. A bad frame or bad request gets an `Error` frame; request errors keep the session open,
protocol errors end this stream only. Other sessions never notice.

Executor work goes through the span's `StepScheduler` (swarm/peer/scheduler.py): decode steps of
different sessions that wait together run as one batch, a long prefill is cut into 64-row chunks
with other sessions' decode steps between them, and each unit runs on the event loop thread or the
span's executor thread by its measured cost. A Forward frame carries at most MAX_FORWARD_TOKENS rows.

Prefix snapshots (swarm/peer/snapshots.py): an `Open` may offer prefix hashes; the peer answers
which lengths it can restore (`OpenOk.restorable`). A first `Forward` with `restore` imports the
snapshot into the session's sequence and truncates it to that length before computing its rows;
a prefill that reaches the whole offered prompt is exported and kept as a new snapshot.

Server push: a `Chain` frame names the next hop (peer, session, addresses) and the previous hop's
peer. The handler then opens a PUSH_PROTOCOL stream to the next hop in the background (`Attach` names
the session there); a `Forward` with `push` is run, its output sent on that stream as a pushed
Forward, and the client answered with a copy (`Hidden.pushed`). `handle_push` serves the receiving
end: only the named previous peer may attach, a pushed frame at a position the session has passed is
dropped as stale (unless it says `rewind`), and answers go to the client's stream. Each session's
frames, from either stream, run one at a time under its lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from swarm.errors import Busy, ExecutorError, PeerUnreachable, ProtocolError, RequestError, SwarmError
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.kv.sessions import SessionSlot, SessionTable
from swarm.limits import MAX_FORWARD_TOKENS
from swarm.p2p import StreamSession
from swarm.peer.rebalance import Drain
from swarm.peer.scheduler import StepScheduler
from swarm.kv.prefix import owner_scoped
from swarm.peer.snapshots import PrefixService
from swarm.sampling import SamplingParams, sample
from swarm.wire import (
    Attach,
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
)

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 30.0
"""A new stream must send its Open frame within this many seconds."""
ATTACH_WAIT_S = 5.0
"""A push stream may wait this long for the Chain that names its sender."""
PUSH_SETUP_WAIT_S = 1.0
"""The first push of a chain waits at most this long for the push stream to open; then that step,
and any later one while it is still opening, is not pushed (the client relays it)."""


@dataclass
class _Prefixes:
    """One session's prefix offers and what this peer can restore of them (n → snapshot hash)."""

    offers: tuple[tuple[int, bytes], ...]
    restorable: dict[int, bytes]
    kept: bool = False


@dataclass
class SpanRuntime:
    """What every stream of one served span shares.

    Attributes:
        model_id: the model served.
        start, end: global half-open layer span.
        executor: the span's llama.cpp executor; touched only under `lock` (see `run`).
        sessions: the span's session table; touched only from the event loop.
        pool: the executor thread for long calls.
        lock: held around every unit of executor work (a peer that moves holds it to swap executors).
        idle_timeout_s: a stream that sends nothing for this long is closed and its session freed.
        shutting_down: set on SIGTERM; new sessions are refused with SHUTTING_DOWN.
        streams: live stream handlers, so shutdown can tell their clients.
        drain: set while the peer drains to move its span; new sessions are refused with BUSY.
        prefixes: prefix snapshots of this span, or None when the peer keeps none.
    """

    model_id: str
    start: int
    end: int
    executor: SpanExecutor
    sessions: SessionTable
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "span-executor"))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    idle_timeout_s: float = 600.0
    shutting_down: bool = False
    streams: set = field(default_factory=set)
    drain: Drain = field(default_factory=Drain)
    prefixes: PrefixService | None = None
    dial: Callable[[str, tuple[str, ...], tuple[str, ...]], Awaitable[StreamSession]] | None = None
    """Opens a PUSH_PROTOCOL stream to (peer id, multiaddrs, direct endpoints); None: no pushing."""
    live: dict[bytes, "_Session"] = field(default_factory=dict)
    """Open sessions by session id (push streams find theirs here)."""
    after_push: Callable[[], None] | None = None
    """Test hook: called after each push, before the client's copy is sent."""
    scheduler: StepScheduler = field(init=False)

    def __post_init__(self) -> None:
        # Chunks of the executor's n_batch rows: the same ubatches as one long forward() call.
        self.scheduler = StepScheduler(lambda: self.executor, self.lock, self.pool,
                                       chunk_tokens=self.executor.n_batch)

    async def run(self, fn, *args, n_tokens: int = 0):
        """Run a blocking executor call alone, between the scheduler's units; returns its result.

        `n_tokens` is accepted for older callers and ignored: where the call runs follows its
        measured cost (see `StepScheduler`)."""
        del n_tokens
        return await self.scheduler.call(fn, *args)


@dataclass(eq=False)
class _Session:
    """One open session on this span: its slot, its client's stream, and its place in a push chain.

    `lock` is held around each frame's work, so frames from the client stream and pushed frames
    (from the previous hop) run one at a time, in arrival order."""

    slot: SessionSlot
    sampling: SamplingParams
    prefixes: _Prefixes
    client: StreamSession
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    chained: asyncio.Condition = field(default_factory=asyncio.Condition)
    """Notified when a Chain changes `prev_peer`."""
    prev_peer: str = ""
    """The peer whose pushed frames this session accepts (Chain.prev_peer)."""
    push: asyncio.Task | None = None
    """Opens (and then holds) the push stream to the next hop; None: the session pushes nowhere."""
    push_waited: bool = False
    """A push already waited for `push` to open (since the last Chain)."""

    async def end_push(self) -> None:
        """Stop pushing: cancel the push stream's setup or close the stream."""
        task, self.push = self.push, None
        if task is None:
            return
        task.cancel()
        try:
            await (await task).close()
        except (asyncio.CancelledError, SwarmError):
            pass


async def handle_stream(rt: SpanRuntime, stream: StreamSession) -> None:
    """Serve one client stream until Close, disconnect, idle timeout or shutdown."""
    rt.streams.add(stream)
    session: _Session | None = None
    try:
        opened = await _open(rt, stream)
        if opened is None:
            return
        session = _Session(*opened, client=stream)
        rt.live[session.slot.session_id] = session
        while True:
            data = await stream.recv(rt.idle_timeout_s)  # idle past the timeout: PeerUnreachable ends it
            try:
                frame = decode_frame(data)
            except ProtocolError as e:
                await _send_error(stream, ErrorCode.PROTOCOL, str(e))
                return
            if isinstance(frame, Close):
                return
            async with session.lock:
                await _answer(rt, session, frame)
    finally:
        rt.streams.discard(stream)
        if session is not None:
            rt.live.pop(session.slot.session_id, None)
            await session.end_push()
            async with session.lock:  # a pushed frame may be running on the session
                seq_id = rt.sessions.release(session.slot.session_id)
                await rt.run(rt.executor.clear, seq_id)
            rt.drain.session_ended(len(rt.sessions))


async def handle_push(rt: SpanRuntime, stream: StreamSession) -> None:
    """Serve one push stream from the previous hop of a chained session (see `Chain`).

    The first frame is `Attach(session_id)`; it is accepted only when the session is open here and
    its client named the stream's peer as `prev_peer`. Every later frame is a `Forward` with `push`,
    run like one from the client; the answer goes to the client's stream. A pushed frame whose pos0
    is not the session's position is stale (a step the client has since finished by relay) and is
    dropped, unless it says `rewind`. The stream ends when the session ends or is chained anew.
    """
    data = await stream.recv(OPEN_TIMEOUT_S)
    try:
        frame = decode_frame(data)
    except ProtocolError as e:
        await _send_error(stream, ErrorCode.PROTOCOL, str(e))
        return
    if not isinstance(frame, Attach):
        await _send_error(stream, ErrorCode.PROTOCOL,
                          f"first frame must be attach, got {type(frame).__name__}")
        return
    session = rt.live.get(frame.session_id)
    if session is None or not await _accepts(session, stream.remote_peer_id):
        await _send_error(stream, ErrorCode.FORBIDDEN, "no session here accepts pushes from this peer")
        return
    await stream.send(encode_frame(OpenOk(reserved_tokens=session.slot.reserved_tokens)))
    while True:
        frame = decode_frame(await stream.recv(rt.idle_timeout_s))
        if not isinstance(frame, Forward) or not frame.push:
            raise ProtocolError(f"a push stream carries pushed forward frames, got {type(frame).__name__}")
        if rt.live.get(session.slot.session_id) is not session or session.prev_peer != stream.remote_peer_id:
            return
        async with session.lock:
            if frame.pos0 == session.slot.pos or (frame.rewind and frame.pos0 < session.slot.pos):
                await _answer(rt, session, frame)
            else:
                logger.debug("stale pushed step %d at %d (session at %d) dropped",
                             frame.step, frame.pos0, session.slot.pos)


async def _accepts(session: _Session, peer_id: str) -> bool:
    """Whether the session takes pushes from `peer_id`, waiting up to ATTACH_WAIT_S for the Chain
    that says so (the client chains every hop at once: a push stream can arrive before it)."""
    async with session.chained:
        try:
            async with asyncio.timeout(ATTACH_WAIT_S):
                await session.chained.wait_for(lambda: session.prev_peer == peer_id)
        except TimeoutError:
            return False
    return True


async def _answer(rt: SpanRuntime, session: _Session, frame) -> None:
    """Run one frame on the session (lock held) and answer the client; push onward when asked."""
    try:
        reply = await _dispatch(rt, session, frame)
    except (RequestError, ExecutorError) as e:
        reply = Error(ErrorCode.BAD_REQUEST, str(e))
    if isinstance(reply, Hidden) and isinstance(frame, Forward) and frame.push:
        reply = Hidden(reply.step, reply.hidden, reply.compute_ms,
                       pushed=await _push(rt, session, frame, reply.hidden))
    try:
        await session.client.send(encode_frame(reply))
    except SwarmError:
        pass  # the client is gone: its stream's handler ends the session


async def _push(rt: SpanRuntime, session: _Session, frame: Forward, out: np.ndarray) -> bool:
    """Send the step's output to the next hop. False when it was not sent: the push stream is still
    being set up (the first push waits up to PUSH_SETUP_WAIT_S for it, later ones not at all; tried
    again next step), or it failed (no more pushes)."""
    task = session.push
    if task is None:
        return False
    if not task.done() and not session.push_waited:
        session.push_waited = True  # once per chain: a slow or unreachable next hop must not stall steps
        await asyncio.wait({task}, timeout=PUSH_SETUP_WAIT_S)
    if not task.done():
        return False  # still opening: the client relays this step
    try:
        stream = task.result()
        await stream.send(encode_frame(Forward(step=frame.step, pos0=frame.pos0, hidden=out, push=True,
                                               rewind=frame.rewind, steps=frame.steps)))
        if rt.after_push is not None:
            rt.after_push()
        return True
    except (SwarmError, OSError, TimeoutError) as e:
        logger.info("push to the next hop failed, the client relays from now on: %s", e)
        await session.end_push()
        return False


async def _open(
    rt: SpanRuntime, stream: StreamSession
) -> tuple[SessionSlot, SamplingParams, _Prefixes] | None:
    data = await stream.recv(OPEN_TIMEOUT_S)
    try:
        frame = decode_frame(data)
    except ProtocolError as e:
        await _send_error(stream, ErrorCode.PROTOCOL, str(e))
        return None
    if not isinstance(frame, Open):
        await _send_error(stream, ErrorCode.PROTOCOL, f"first frame must be open, got {type(frame).__name__}")
        return None
    if frame.client_id != stream.remote_peer_id:
        await _send_error(stream, ErrorCode.FORBIDDEN, "client_id does not match the stream's peer id")
        return None
    if rt.shutting_down:
        await _send_error(stream, ErrorCode.SHUTTING_DOWN, "peer is shutting down")
        return None
    if rt.drain.active:
        await _send_error(stream, ErrorCode.BUSY, rt.drain.active)
        return None
    if frame.model_id != rt.model_id or (frame.start, frame.end) != (rt.start, rt.end):
        await _send_error(
            stream,
            ErrorCode.NOT_FOUND,
            f"this peer serves layers [{rt.start}, {rt.end}) of model {rt.model_id[:16]}",
        )
        return None
    try:
        admission = rt.sessions.admit(
            frame.session_id, stream.remote_peer_id, frame.max_tokens, time.monotonic()
        )
    except Busy as e:
        await _send_error(stream, ErrorCode.BUSY, str(e))
        return None
    except RequestError as e:
        await _send_error(stream, ErrorCode.BAD_REQUEST, str(e))
        return None
    for seq_id in admission.evicted_seq_ids:
        await rt.run(rt.executor.clear, seq_id)
    # A seq id can come back from a session that ended abnormally; start from an empty cache.
    await rt.run(rt.executor.clear, admission.slot.seq_id)
    prefixes, fetched_from = _Prefixes(owner_scoped(frame.prefixes, stream.remote_peer_id), {}), ""
    if frame.prefixes and rt.prefixes is not None:
        prefixes.restorable, fetched = await rt.prefixes.prepare(prefixes.offers)
        fetched_from = fetched.peer_id if fetched is not None else ""
    restorable = (
        tuple(sorted(n for n in prefixes.restorable if n < frame.prefixes[-1][0])) if frame.prefixes else ()
    )
    ok = OpenOk(
        reserved_tokens=admission.slot.reserved_tokens, restorable=restorable, fetched_from=fetched_from
    )
    await stream.send(encode_frame(ok))
    return admission.slot, frame.sampling, prefixes


async def _dispatch(rt: SpanRuntime, session: _Session, frame):
    slot, sampling, prefixes = session.slot, session.sampling, session.prefixes
    if isinstance(frame, Forward):
        if frame.restore:
            await _restore(rt, slot, frame.restore, prefixes)
        if frame.n_tokens > MAX_FORWARD_TOKENS:
            raise RequestError(f"a Forward frame carries at most {MAX_FORWARD_TOKENS} tokens, got "
                               f"{frame.n_tokens}: send the prompt in several frames")
        if frame.rewind and frame.pos0 < slot.pos:
            await _truncate(rt, slot, frame.pos0)
        rt.sessions.check_forward(slot, frame.pos0, frame.n_tokens)
        if frame.hidden.shape[1] != rt.executor.n_embd:
            raise RequestError(f"hidden size {frame.hidden.shape[1]} != span's {rt.executor.n_embd}")
        reply = await _compute(rt, slot.seq_id, frame, sampling)
        rt.sessions.advance(slot, frame.n_tokens, time.monotonic())
        if (
            rt.prefixes is not None
            and prefixes.offers
            and not prefixes.kept
            and slot.pos == prefixes.offers[-1][0]
        ):
            prefixes.kept = True  # the whole offered prompt is in the cache: keep it once
            if rt.prefixes.wants(prefixes.offers):
                kv = await rt.run(rt.executor.export_seq, slot.seq_id, n_tokens=slot.pos)
                rt.prefixes.keep(prefixes.offers, kv)
        return reply
    if isinstance(frame, Truncate):
        await _truncate(rt, slot, frame.pos)
        return OpenOk(reserved_tokens=slot.reserved_tokens)
    if isinstance(frame, Chain):
        await _chain(rt, session, frame)
        return OpenOk(reserved_tokens=slot.reserved_tokens)
    raise RequestError(f"unexpected {type(frame).__name__} frame in an open session")


async def _truncate(rt: SpanRuntime, slot: SessionSlot, pos: int) -> None:
    if not 0 <= pos <= slot.pos:
        raise RequestError(f"truncate to {pos}: the session holds positions 0..{slot.pos - 1}")
    # the cache first: a recurrent state cannot roll back into a sequence (ArchRow.rollback_exact),
    # and when the executor refuses, the table must still say where the cache is
    await rt.run(rt.executor.truncate, slot.seq_id, pos)
    rt.sessions.truncate(slot, pos)


async def _chain(rt: SpanRuntime, session: _Session, frame: Chain) -> None:
    """Take the session's new place in a push chain: start opening the push stream to the next hop
    (in the background: the first push waits for it) and accept pushes from `prev_peer` only. Only
    a frame that is wrong whatever the peer is refused: the client does not wait for the answer."""
    if frame.next_peer and rt.executor.is_last:
        raise RequestError("the last span samples: it pushes to no next hop")
    await session.end_push()
    session.push_waited = False
    if frame.next_peer and rt.dial is not None:  # a peer that cannot dial answers `pushed` false
        session.push = asyncio.ensure_future(_connect_push(rt, frame))
    async with session.chained:
        session.prev_peer = frame.prev_peer
        session.chained.notify_all()


async def _connect_push(rt: SpanRuntime, chain: Chain) -> StreamSession:
    """A push stream to the next hop of `chain`, attached to its session.

    Raises:
        PeerUnreachable: no stream, or the next hop refused the attach.
        PeerTimeout: no answer within OPEN_TIMEOUT_S.
    """
    stream = await rt.dial(chain.next_peer, chain.next_addrs, chain.next_direct)
    try:
        await stream.send(encode_frame(Attach(chain.next_session)))
        reply = decode_frame(await stream.recv(OPEN_TIMEOUT_S))
    except BaseException:
        await stream.close()
        raise
    if not isinstance(reply, OpenOk):
        await stream.close()
        raise PeerUnreachable(f"peer {chain.next_peer[:12]}… refused the push stream: {reply}")
    return stream


async def _restore(rt: SpanRuntime, slot: SessionSlot, n: int, prefixes: _Prefixes) -> None:
    """Load the snapshot that covers prefix length `n` into the session's empty sequence.

    Raises:
        RequestError: not the session's first step, `n` was not offered as restorable, or the
            snapshot was evicted since Open or could not be imported (the sequence stays empty).
    """
    if slot.pos != 0:
        raise RequestError(f"restore only on a session's first step (the session is at {slot.pos})")
    snapshot_hash = prefixes.restorable.get(n)
    kv = rt.prefixes.snapshot_kv(snapshot_hash) if rt.prefixes is not None and snapshot_hash else None
    if kv is None:
        raise RequestError(f"prefix of {n} tokens is not restorable here (evicted or never offered)")

    def load() -> None:
        try:
            rt.executor.import_seq(slot.seq_id, kv)
            rt.executor.truncate(slot.seq_id, n)
            if rt.executor.pos_max(slot.seq_id) != n - 1:
                raise ExecutorError(f"snapshot holds {rt.executor.pos_max(slot.seq_id) + 1} tokens, not {n}")
        except ExecutorError:
            rt.executor.clear(slot.seq_id)
            raise

    await rt.run(load, n_tokens=n)
    rt.sessions.advance(slot, n, time.monotonic())


async def _compute(rt: SpanRuntime, seq_id: int, frame: Forward, sampling: SamplingParams):
    """Run the span through the scheduler, and on the last span sample. Returns the reply frame."""
    hidden = np.ascontiguousarray(frame.hidden, dtype=np.float32)
    all_logits = frame.want_logits and frame.all_logits
    r = await rt.scheduler.step(seq_id, frame.pos0, hidden, all_logits=all_logits, steps=frame.steps)
    if not rt.executor.is_last:
        return Hidden(step=frame.step, hidden=r.out, compute_ms=r.compute_ms)
    t0 = time.perf_counter()
    s = sample(r.out[-1], sampling, position=frame.pos0 + frame.n_tokens)
    return Token(
        step=frame.step,
        token=s.token,
        logprob=s.logprob,
        top=s.top,
        compute_ms=r.compute_ms + (time.perf_counter() - t0) * 1000.0,
        logits=r.out if frame.want_logits else None,
    )


async def _send_error(stream: StreamSession, code: ErrorCode, message: str) -> None:
    try:
        await stream.send(encode_frame(Error(code, message)))
    except SwarmError:
        pass  # the client is gone; nothing to tell
