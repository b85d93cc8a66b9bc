"""Persistent, framed, bidirectional peer-to-peer streams over hivemind's libp2p daemon (p2pd).

A client opens one stream per (client, hop) and keeps it for a whole generation: it sends frames and
reads reply frames many times, then closes. libp2p authenticates both ends, so a server-side handler
knows the remote peer id for sure (that is how a session is bound to its client).

Framing: a 4-byte big-endian length, then that many bytes. A frame longer than the receiver's
`max_frame_bytes` is refused: the receiver raises ProtocolError and closes that stream only. The same
framing runs over swarm.direct's TCP connections, where a `FrameCipher` seals every frame. A receiver
may also set a `FrameGate`, asked with each frame's length before its body is read: it reserves the
bytes (and may wait for room) or refuses the frame, so a length prefix alone allocates nothing.

This module moves bytes; it does not know what the frames mean (swarm.wire) or where peers are (swarm.dht).
It stays one file past the house's ~400 lines: the stream, its framing, its gate and the ping that
measures a path (round trip and the remote's wall time) are one concern, the framed libp2p stream.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
from typing import Awaitable, Callable, Iterable, Optional, Protocol

from hivemind.p2p import P2P, P2PDaemonError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.dht import clock
from swarm.dht.clock import ClockProbe
from swarm.errors import PeerTimeout, PeerUnreachable, ProtocolError, SwarmError
from swarm.limits import MAX_FRAME_BYTES, PING_PROTOCOL

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")

LINGER_IDLE_S = 2.0
"""`FramedStream.linger_close` stops reading when the remote sent nothing for this long (s)."""
LINGER_MAX_S = 30.0
"""... and after this long in all (s), so a sender that trickles costs little: 60 MiB at 2 MB/s."""


class StreamClosed(PeerUnreachable):
    """The remote side closed the stream cleanly, between two frames."""


class FrameRefused(SwarmError):
    """The stream's `FrameGate` refused the next frame (a limit on bytes in flight). Its body is left
    unread, so the stream can no longer be read; it stays open for sending the reason, then close it."""


FrameGate = Callable[[int], Awaitable[Callable[[], None]]]
"""Called with a frame's body length (bytes on the wire) before the body is read; returns the function
that gives the reservation back, which the stream calls at its next `recv` or at `close` (so a frame's
bytes stay reserved while the receiver works on it). It may wait for room; it raises FrameRefused."""


class FrameCipher(Protocol):
    """Seals frames for sending and opens received ones, in stream order (swarm.direct)."""

    overhead: int
    """Bytes a sealed frame has beyond its plaintext."""

    def seal(self, frame: bytes) -> bytes:
        """The next frame to send, sealed."""

    def open(self, sealed: bytes) -> bytes:
        """The next received frame, opened. Raises ProtocolError when it is not authentic."""


class FramedStream:
    """One open stream to one remote peer, carrying length-prefixed frames both ways.

    Use one sender and one receiver task at a time. Every failure closes the stream.

    Attributes:
        remote_peer_id: base58 peer id of the other end, authenticated by libp2p (or, on a direct
            connection, by the ticket it redeemed: swarm.direct).
        protocol: the protocol name the stream was opened for.
        max_frame_bytes: largest frame this side accepts or sends (plaintext).
        cipher: seals and opens every frame (direct connections); None on libp2p, which encrypts
            and authenticates itself.
        remote_addr: the multiaddr the other end's connection came from, as this side's daemon saw it
            (its address from outside, for swarm.reach); "" when not known (streams this side opened).
    """

    def __init__(
        self,
        remote_peer_id: str,
        protocol: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        cipher: FrameCipher | None = None,
        remote_addr: str = "",
    ):
        self.remote_peer_id = remote_peer_id
        self.remote_addr = remote_addr
        self.protocol = protocol
        self.max_frame_bytes = max_frame_bytes
        self.cipher = cipher
        self._reader = reader
        self._writer = writer
        self._closed = False
        self._gate: FrameGate | None = None
        self._release: Callable[[], None] | None = None
        self._sent_last = False

    def set_gate(self, gate: FrameGate | None) -> None:
        """Ask `gate` before reading each later frame's body (see `FrameGate`); None: no gate."""
        self._gate = gate

    def _release_frame(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    @property
    def closed(self) -> bool:
        """True once close() ran or a failure closed the stream."""
        return self._closed

    async def send(self, frame: bytes) -> None:
        """Send one frame.

        Args:
            frame: payload, at most max_frame_bytes.
        Raises:
            ProtocolError: the frame is too large (the stream is closed).
            PeerUnreachable: the stream is closed or broke (the reading side stays open so that
                `last_words` can read what the peer said before leaving; close it).
        """
        if self._closed:
            raise PeerUnreachable(f"stream to {self.remote_peer_id} is closed")
        if len(frame) > self.max_frame_bytes:
            await self.close()
            raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {self.max_frame_bytes}")
        if self.cipher is not None:
            frame = self.cipher.seal(frame)
        try:
            self._writer.writelines((_HEADER.pack(len(frame)), frame))
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as e:
            raise PeerUnreachable(f"stream to {self.remote_peer_id} broke while sending: {e}") from e

    @property
    def sent_last(self) -> bool:
        """True once `send_last` sent this side's last frame: close it with `linger_close`."""
        return self._sent_last

    async def send_last(self, frame: bytes) -> None:
        """Send this side's last frame (an Error before hanging up); close the stream afterwards
        with `linger_close`, so that the frame reaches the remote. Raises as `send`."""
        self._sent_last = True
        await self.send(frame)

    async def last_words(self, timeout_s: float = 1.0) -> Optional[bytes]:
        """After a failed send: a frame the peer sent before hanging up (e.g. why it left), or None.

        The stream is closed afterwards either way.
        """
        try:
            return await self.recv(timeout_s)
        except SwarmError:
            # asyncio's StreamReader raises the connection error before handing out bytes it had
            # already received, so read a complete frame left in its buffer directly.
            buf = bytes(getattr(self._reader, "_buffer", b""))
            if len(buf) >= _HEADER.size:
                (length,) = _HEADER.unpack(buf[: _HEADER.size])
                if length <= self._max_wire_bytes and len(buf) >= _HEADER.size + length:
                    return self._opened(buf[_HEADER.size : _HEADER.size + length])
            return None
        finally:
            await self.close()

    async def recv(self, timeout_s: Optional[float] = None) -> bytes:
        """Receive the next frame.

        Args:
            timeout_s: give up after this many seconds (None waits for ever).
        Returns:
            the frame's payload, at most max_frame_bytes.
        Raises:
            StreamClosed: the remote side closed the stream between frames.
            ProtocolError: the announced frame length exceeds max_frame_bytes (the stream is closed).
            FrameRefused: the gate refused the frame (the stream stays open for sending; close it).
            PeerTimeout: no frame within timeout_s, the gate's wait included (the stream is closed).
            PeerUnreachable: the stream broke mid-frame or was reset (the stream is closed).
        """
        self._release_frame()  # the receiver is done with the previous frame
        if self._closed:
            raise PeerUnreachable(f"stream to {self.remote_peer_id} is closed")
        try:
            async with asyncio.timeout(timeout_s):  # no extra task, unlike wait_for
                return await self._read_frame()
        except TimeoutError as e:
            await self.close()
            raise PeerTimeout(f"no frame from {self.remote_peer_id} within {timeout_s:.1f} s") from e
        except FrameRefused:
            raise
        except SwarmError:
            await self.close()
            raise

    async def _read_frame(self) -> bytes:
        try:
            header = await self._reader.readexactly(_HEADER.size)
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise StreamClosed(f"{self.remote_peer_id} closed the stream") from e
            raise PeerUnreachable(f"stream from {self.remote_peer_id} broke inside a frame header") from e
        except (ConnectionError, OSError) as e:
            raise PeerUnreachable(f"stream from {self.remote_peer_id} broke: {e}") from e
        (length,) = _HEADER.unpack(header)
        if length > self._max_wire_bytes:
            raise ProtocolError(
                f"{self.remote_peer_id} sent a frame of {length} bytes, "
                f"over the limit of {self._max_wire_bytes}"
            )
        if self._gate is not None:
            self._release = await self._gate(length)
        try:
            data = await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            raise PeerUnreachable(f"stream from {self.remote_peer_id} broke inside a frame") from e
        return data if self.cipher is None else self.cipher.open(data)

    @property
    def _max_wire_bytes(self) -> int:
        return self.max_frame_bytes + (0 if self.cipher is None else self.cipher.overhead)

    def _opened(self, data: bytes) -> Optional[bytes]:
        if self.cipher is None:
            return data
        try:
            return self.cipher.open(data)
        except ProtocolError:
            return None

    async def close(self) -> None:
        """Close the stream (idempotent). The remote's next recv raises StreamClosed."""
        self._release_frame()
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def linger_close(self) -> None:
        """Close after a last frame (`send_last`) so that it reaches the remote: stop sending, read
        and discard what the remote still sends (the rest of a refused frame) until it hangs up,
        goes quiet for LINGER_IDLE_S, or LINGER_MAX_S pass. The discarded bytes are never buffered
        beyond one read.

        A close with unread bytes in the receive buffer makes the kernel send a reset, which can
        destroy the last frame before the remote reads it; RFC 9112 section 9.6 ("lingering close")
        gives the same advice to HTTP servers. Through p2pd even a clean close can: the daemon
        closes the libp2p stream for reading too and then resets it (go-libp2p-daemon stream.go,
        doStreamPipe), racing the frame to the remote. So a libp2p stream is not half-closed here
        (p2pd would turn that into the same close): it stays open until the remote hangs up,
        which a client does once it has read the frame. A direct stream is half-closed, so its
        remote reads the end at once.
        """
        self._release_frame()
        if self._closed:
            return
        try:
            if self.cipher is not None and self._writer.can_write_eof():
                self._writer.write_eof()
            async with asyncio.timeout(LINGER_MAX_S):
                while await asyncio.wait_for(self._reader.read(1 << 16), LINGER_IDLE_S):
                    pass
        except (TimeoutError, ConnectionError, OSError, RuntimeError):
            pass  # the remote went away, went quiet or kept trickling: close either way
        await self.close()

    async def __aenter__(self) -> "FramedStream":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


StreamHandler = Callable[[FramedStream], Awaitable[None]]


class SwarmP2P:
    """Framed streams and RTT probes over one hivemind P2P instance (one p2pd, one peer id).

    Build with `await SwarmP2P.create(p2p)`, which also answers ping probes. The P2P instance's life
    belongs to whoever created it (swarm.dht.node.SwarmDHT for the DHT's own daemon).
    """

    def __init__(self, p2p: P2P):
        self._p2p = p2p
        self.peer_id: str = p2p.peer_id.to_base58()
        self._handler_tasks: set[asyncio.Task] = set()
        self._closing = False

    @classmethod
    async def create(cls, p2p: P2P) -> "SwarmP2P":
        """Wrap `p2p` and start serving PING_PROTOCOL."""
        self = cls(p2p)
        await self.serve(PING_PROTOCOL, answer_pings, max_frame_bytes=64)
        return self

    async def serve(
        self, protocol_name: str, handler: StreamHandler, *, max_frame_bytes: int = MAX_FRAME_BYTES
    ) -> None:
        """Run `handler(session)` for every incoming stream of `protocol_name`, each in its own task.

        The stream is closed when the handler returns or raises. StreamClosed ends a handler quietly;
        other errors are logged and only that stream is lost, the server keeps serving.

        Raises:
            PeerUnreachable: the local p2pd refused the registration (also when the name is served
                already: p2pd answers "handler for protocol ... already set").
        """

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            session = FramedStream(info.peer_id.to_base58(), info.proto, reader, writer, max_frame_bytes,
                                   remote_addr=str(info.addr))
            try:
                await self.run_handler(handler, session)
            except asyncio.CancelledError:
                if not self._closing:
                    raise
                # `close` cancelled it: end the task normally, since hivemind's done-callback asks
                # the task for its exception, which raises for a cancelled task (asyncio then logs
                # an ERROR with a traceback in every peer stopped while a stream was open)

        try:
            await self._p2p.add_binary_stream_handler(protocol_name, on_stream)
        except P2PDaemonError as e:
            raise PeerUnreachable(f"cannot serve {protocol_name}: {e}") from e

    async def run_handler(self, handler: StreamHandler, session: FramedStream) -> None:
        """Run `handler(session)` as one of this instance's handlers (cancelled by `close`), then close
        the session. StreamClosed ends it quietly; other errors are logged and end this stream only.
        Also serves streams that arrive by other ways (swarm.direct)."""
        if self._closing:
            await session.close()
            return
        task = asyncio.current_task()
        self._handler_tasks.add(task)
        try:
            await handler(session)
        except StreamClosed:
            pass
        except SwarmError as e:
            logger.info("stream %s from %s ended: %s", session.protocol, session.remote_peer_id, e)
        except Exception:
            logger.exception(
                "handler for %s failed on a stream from %s", session.protocol, session.remote_peer_id
            )
        finally:
            self._handler_tasks.discard(task)
            await session.close()

    async def close(self) -> None:
        """Stop serving: cancel running handlers (their streams close) and detach from p2pd; a p2pd this
        instance did not start keeps running."""
        self._closing = True
        handlers = list(self._handler_tasks)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await self._p2p.shutdown()

    async def open_stream(
        self,
        peer_id: str,
        addrs: Iterable[str],
        protocol_name: str,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> FramedStream:
        """Open a stream to `peer_id` for `protocol_name`.

        Args:
            peer_id: base58 peer id of the server.
            addrs: multiaddr strings to dial if not yet connected (a trailing /p2p/<id> is allowed);
                may be empty when the peer is already connected or known to the local daemon.
            protocol_name: the name the server passed to serve().
            max_frame_bytes: largest frame this side accepts or sends on the new stream.
        Returns:
            an open FramedStream (close it, or use `async with`).
        Raises:
            ProtocolError: peer_id or an address is malformed.
            PeerUnreachable: the peer cannot be dialled or does not serve `protocol_name`.
        """
        remote = _parse_peer_id(peer_id)
        maddrs = [_parse_maddr(a) for a in addrs]
        try:
            if maddrs:
                await self._p2p._client.connect(remote, maddrs)  # hivemind's P2P exposes no public connect
            _, reader, writer = await self._p2p.call_binary_stream_handler(remote, protocol_name)
        except (P2PDaemonError, ConnectionError, OSError) as e:
            raise PeerUnreachable(f"cannot open {protocol_name} to {peer_id}: {e}") from e
        return FramedStream(peer_id, protocol_name, reader, writer, max_frame_bytes)

    async def ping(
        self, peer_id: str, addrs: Iterable[str] = (), *, rounds: int = 3, timeout_s: float = 5.0
    ) -> float:
        """Round-trip time to a peer, ms: the fastest of `rounds` echoes on one fresh stream (the
        stream's opening is not counted).

        Raises:
            ProtocolError: peer_id or an address is malformed.
            PeerUnreachable: the peer cannot be dialled, does not answer, or takes over timeout_s.
        """
        rtt_ms, _ = await self.probe(peer_id, addrs, rounds=rounds, timeout_s=timeout_s)
        return rtt_ms

    async def probe(
        self, peer_id: str, addrs: Iterable[str] = (), *, rounds: int = 3, timeout_s: float = 5.0
    ) -> tuple[float, Optional[ClockProbe]]:
        """Ping a peer `rounds` times on one fresh stream, asking for its wall time.

        Returns:
            (round trip of the fastest exchange in ms, that exchange's clock estimate or None when the
            peer only echoes: a node older than clock probes).
        Raises:
            ProtocolError: peer_id or an address is malformed.
            PeerUnreachable: the peer cannot be dialled, does not answer, or takes over timeout_s.
        """
        async with await self.open_stream(peer_id, addrs, PING_PROTOCOL, max_frame_bytes=64) as stream:
            best_s, clocks = float("inf"), []
            for _ in range(rounds):
                t0, sent_s = time.perf_counter(), time.time()
                await stream.send(_TIME_PING)
                reply = await stream.recv(timeout_s)
                rtt_s = time.perf_counter() - t0
                best_s = min(best_s, rtt_s)
                if reply == _TIME_PING:  # an echo
                    continue
                if len(reply) != len(_TIME_PING) + _WALL.size or not reply.startswith(_TIME_PING):
                    raise PeerUnreachable(f"{peer_id} answered a ping with {len(reply)} wrong bytes")
                (remote_s,) = _WALL.unpack_from(reply, len(_TIME_PING))
                if math.isfinite(remote_s):
                    clocks.append(clock.probe(sent_s, sent_s + rtt_s, remote_s))
        return best_s * 1000.0, clock.best(clocks)


_TIME_PING = b"swarmtime"
"""A ping frame; the answer is the same bytes followed by the responder's wall time (_WALL). Older
nodes echo any frame unchanged, which a prober takes as an answer without a time."""
_WALL = struct.Struct(">d")
"""Wall-clock seconds since the Unix epoch, big-endian float64."""


async def answer_pings(stream: FramedStream) -> None:
    """Ping responder (PING_PROTOCOL, on libp2p and relayed streams): answer each time ping with the wall time, echo anything else, until the prober
    closes."""
    while True:
        frame = await stream.recv()
        await stream.send(frame + _WALL.pack(time.time()) if frame == _TIME_PING else frame)


def _parse_peer_id(peer_id: str) -> PeerID:
    try:
        parsed = PeerID.from_base58(peer_id)
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"malformed peer id {peer_id!r}") from e
    if not parsed.to_bytes():
        raise ProtocolError(f"malformed peer id {peer_id!r}")
    return parsed


def _parse_maddr(addr: str) -> Multiaddr:
    """Multiaddr string -> Multiaddr without its trailing /p2p/<id> (p2pd's connect wants bare
    addresses); a /p2p/ inside (a circuit address's relay) stays."""
    head, sep, tail = addr.rpartition("/p2p/")
    try:
        return Multiaddr(head if sep and "/" not in tail else addr)
    except Exception as e:  # multiaddr raises several exception types on malformed input
        raise ProtocolError(f"malformed multiaddr {addr!r}") from e
