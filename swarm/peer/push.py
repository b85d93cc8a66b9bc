"""Server push on a peer: a chained session's stream to its next hop, and the push streams that
feed a session from its previous hop.

A `Chain` frame names the next hop (peer, session, addresses) and the previous hop's peer. The
session's `PushState` then opens a PUSH_PROTOCOL stream to the next hop in the background (`Attach`
names the session there); a `Forward` with `push` is run, its output sent on that stream as a pushed
Forward (with the step's token ids, `Forward.token_ids`, which the next hop may read), and the
client answered with a copy (`Hidden.pushed`). `serve_push` serves the receiving end: only the named
previous peer may attach, a pushed frame at a position the session has passed is dropped as stale
(unless it says `rewind`; `swarm.peer.rules.accepts_pushed`), and answers go to the client's stream.
Each session's frames, from either stream, run one at a time under its lock.

This module does not: run frames (the handler's `answer`, passed in, does) or own sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from swarm.errors import PeerUnreachable, ProtocolError, RequestError, SwarmError
from swarm.p2p import FramedStream
from swarm.peer.rules import accepts_pushed, chain_refusal
from swarm.wire import Attach, Chain, Error, ErrorCode, Forward, OpenOk, decode_frame, encode_frame

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 30.0
"""A new stream must send its first frame (Open, Attach) within this many seconds, and the next
hop answer an Attach within as long."""
ATTACH_WAIT_S = 5.0
"""A push stream may wait this long for the Chain that names its sender."""
PUSH_SETUP_WAIT_S = 1.0
"""The first push of a chain waits at most this long for the push stream to open; then that step,
and any later one while it is still opening, is not pushed (the client relays it)."""

Dial = Callable[[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], Awaitable[FramedStream]]
"""Opens a PUSH_PROTOCOL stream to (peer id, multiaddrs, direct endpoints, relay addresses)."""


@dataclass(eq=False)
class PushState:
    """One session's place in a push chain: whose pushes it takes, and its stream to the next hop."""

    chained: asyncio.Condition = field(default_factory=asyncio.Condition)
    """Notified when a Chain changes `prev_peer`."""
    prev_peer: str = ""
    """The peer whose pushed frames this session accepts (Chain.prev_peer)."""
    task: asyncio.Task | None = None
    """Opens (and then holds) the push stream to the next hop; None: the session pushes nowhere."""
    waited: bool = False
    """A push already waited for `task` to open (since the last Chain)."""

    async def end(self) -> None:
        """Stop pushing: cancel the push stream's setup or close the stream."""
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        try:
            await (await task).close()
        except (asyncio.CancelledError, SwarmError):
            pass

    async def chain(self, frame: Chain, is_last: bool, dial: Dial | None) -> None:
        """Take the session's new place in a push chain: start opening the push stream to the next
        hop (in the background: the first push waits for it) and accept pushes from `prev_peer`
        only. Only a frame that is wrong whatever the peer is refused: the client does not wait for
        the answer.

        Raises:
            RequestError: a next hop named for the last span.
        """
        why = chain_refusal(frame.next_peer, is_last)
        if why is not None:
            raise RequestError(why)
        await self.end()
        self.waited = False
        if frame.next_peer and dial is not None:  # a peer that cannot dial answers `pushed` false
            self.task = asyncio.ensure_future(_connect(dial, frame))
        async with self.chained:
            self.prev_peer = frame.prev_peer
            self.chained.notify_all()

    async def accepts(self, peer_id: str) -> bool:
        """Whether the session takes pushes from `peer_id`, waiting up to ATTACH_WAIT_S for the Chain
        that says so (the client chains every hop at once: a push stream can arrive before it)."""
        async with self.chained:
            try:
                async with asyncio.timeout(ATTACH_WAIT_S):
                    await self.chained.wait_for(lambda: self.prev_peer == peer_id)
            except TimeoutError:
                return False
        return True

    async def send(self, frame: Forward, out: np.ndarray, after_push: Callable[[], None] | None) -> bool:
        """Send the step's output to the next hop. False when it was not sent: the push stream is
        still being set up (the first push waits up to PUSH_SETUP_WAIT_S for it, later ones not at
        all; tried again next step), or it failed (no more pushes).

        Args:
            frame: the step as the client sent it.
            out: its output rows [n_tokens, n_embd].
            after_push: test hook called after a push is sent.
        """
        task = self.task
        if task is None:
            return False
        if not task.done() and not self.waited:
            self.waited = True  # once per chain: a slow or unreachable next hop must not stall steps
            await asyncio.wait({task}, timeout=PUSH_SETUP_WAIT_S)
        if not task.done():
            return False  # still opening: the client relays this step
        try:
            stream = task.result()
            await stream.send(encode_frame(Forward(step=frame.step, pos0=frame.pos0, hidden=out, push=True,
                                                   rewind=frame.rewind, steps=frame.steps,
                                                   verify=frame.verify, token_ids=frame.token_ids,
                                                   want_draft=frame.want_draft)))
            if after_push is not None:
                after_push()
            return True
        except (SwarmError, OSError, TimeoutError) as e:
            logger.info("push to the next hop failed, the client relays from now on: %s", e)
            await self.end()
            return False


async def _connect(dial: Dial, chain: Chain) -> FramedStream:
    """A push stream to the next hop of `chain`, attached to its session.

    Raises:
        PeerUnreachable: no stream, or the next hop refused the attach.
        PeerTimeout: no answer within OPEN_TIMEOUT_S.
    """
    stream = await dial(chain.next_peer, chain.next_addrs, chain.next_direct, chain.next_relay)
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


async def serve_push(stream: FramedStream, live: Mapping[bytes, object], idle_timeout_s: float,
                     answer: Callable[[object, Forward], Awaitable[None]]) -> None:
    """Serve one push stream from the previous hop of a chained session.

    The first frame is `Attach(session_id)`; it is accepted only when the session is open here and
    its client named the stream's peer as `prev_peer`. Every later frame is a `Forward` with `push`,
    run like one from the client by `answer(session, frame)`, which answers the client's stream. A
    stale pushed frame (`swarm.peer.rules.accepts_pushed`) is dropped. The stream ends when the
    session ends or is chained anew.

    Args:
        stream: the push stream.
        live: open sessions by session id; each has `slot`, `lock` and `push` (a `PushState`).
        idle_timeout_s: a push stream silent this long ends.
        answer: runs a frame on a session (under its lock) and answers its client.
    Raises:
        ProtocolError: a later frame is not a pushed Forward.
        PeerUnreachable, PeerTimeout: the stream failed or went silent.
    """
    data = await stream.recv(OPEN_TIMEOUT_S)
    try:
        frame = decode_frame(data)
    except ProtocolError as e:
        await send_error(stream, ErrorCode.PROTOCOL, str(e))
        return
    if not isinstance(frame, Attach):
        await send_error(stream, ErrorCode.PROTOCOL,
                         f"first frame must be attach, got {type(frame).__name__}")
        return
    session = live.get(frame.session_id)
    if session is None or not await session.push.accepts(stream.remote_peer_id):
        await send_error(stream, ErrorCode.FORBIDDEN, "no session here accepts pushes from this peer")
        return
    await stream.send(encode_frame(OpenOk(reserved_tokens=session.slot.reserved_tokens)))
    while True:
        frame = decode_frame(await stream.recv(idle_timeout_s))
        if not isinstance(frame, Forward) or not frame.push:
            raise ProtocolError(f"a push stream carries pushed forward frames, got {type(frame).__name__}")
        if live.get(session.slot.session_id) is not session:
            return  # the session ended
        if session.push.prev_peer != stream.remote_peer_id:
            return  # chained anew: another peer pushes to it now
        async with session.lock:
            if accepts_pushed(frame.pos0, frame.rewind, session.slot.pos):
                await answer(session, frame)
            else:
                logger.debug("stale pushed step %d at %d (session at %d) dropped",
                             frame.step, frame.pos0, session.slot.pos)


async def send_error(stream: FramedStream, code: ErrorCode, message: str) -> None:
    """Send an Error frame as the stream's last (close it with `FramedStream.linger_close`), unless
    the stream is gone already (nothing to tell then)."""
    try:
        await stream.send_last(encode_frame(Error(code, message)))
    except SwarmError:
        pass
