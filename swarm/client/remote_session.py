"""One generation's session on the swarm (`RemoteSession`, an `EngineSession` of `RemoteEngine`,
swarm/client/remote.py): embeds tokens, sends the prompt in chunks, runs decode steps and verify
passes through a `RouteSession` (swarm/client/session.py) on the connection's loop thread, and makes
the generation loop's synchronous calls wait for them.

A decode step whose successor the loop will ask for (`decode`'s `follow`) is followed at once, from
the loop thread: the next step goes out as soon as the token is back, before the caller's thread has
even woken, so the generation loop's own work and two thread wake-ups stay off the path between one
token and the next (~1 ms per token on the project's 2-core machine kind, docs/benchmarks.md).

This module does not plan routes, fail over or check peers (swarm/client/session.py,
swarm/client/checks.py), nor join the swarm (swarm/client/remote.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from swarm.client.engine import Rewind, StepResult
from swarm.client.loop import LoopThread
from swarm.client.session import Rewound, RouteSession
from swarm.errors import SwarmError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.kv.prefix import prefix_offers
from swarm.spec.verify import accepted
from swarm.wire import Token

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 900.0
"""Outer bound on one synchronous call into the loop; every await inside has its own, shorter one."""


class RemoteSession:
    """`EngineSession` over a `RouteSession`: embeds tokens, chunks the prompt, waits on the loop."""

    def __init__(self, loop: LoopThread, route: RouteSession, embedder: TokenEmbedder, chunk_tokens: int,
                 reuse_prefixes: bool = False):
        self._loop, self.route, self._embedder, self._chunk = loop, route, embedder, chunk_tokens
        self._reuse = reuse_prefixes
        self._closed = False
        self._ahead: _Ahead | None = None
        self.on_close = None

    @property
    def verify_rows(self) -> int:
        """The route's proven exact row group (`RouteSession.verify_rows`): a verify pass of this
        many rows costs each hop one step."""
        return self.route.verify_rows

    def prefill(self, tokens) -> StepResult:
        """Open the route (offering the prompt's prefixes), then send the prompt from the restored
        length on, in chunks starting at multiples of the chunk size; return the token sampled after it.

        Raises:
            NoRoute: no chain of live peers with room for the session.
        """
        tokens = list(tokens)
        x = self._embedder.embed(tokens)
        ids = np.asarray(tokens, dtype=np.int32)
        offers = prefix_offers(tokens) if self._reuse else ()
        self._loop.run(self.route.open(offers, lambda n: x[:n], len(tokens), prompt_ids=ids), CALL_TIMEOUT_S)
        token = None
        for i in range(self.route.pos, len(tokens), self._chunk):
            step = self.route.step(x[i : i + self._chunk], token_ids=ids[i : i + self._chunk],
                                   draft=i + self._chunk >= len(tokens))
            token = self._loop.run(step, CALL_TIMEOUT_S)
        assert token is not None
        token = self._loop.run(self.route.verify_prefill(), CALL_TIMEOUT_S) or token
        return StepResult(token=token.token, logprob=token.logprob, top=token.top)

    def decode(self, token: int, follow: Callable[[int], bool] | None = None) -> StepResult:
        """Send one token's hidden state through the route; return the next sampled token.

        `follow` (called on the loop thread with the sampled token, as soon as it is back) says
        whether the next call will be `decode` of that token: then that step is sent at once, from
        the loop thread, and the next call only waits for its answer. The generation loop's own
        Python (detokenizing, stop strings, handing the token over) and two thread wake-ups then
        stay off the path between one token's answer and the next token's step (~1 ms per token on
        the project's 2-core machine kind, docs/benchmarks.md). A step sent ahead that is never
        asked for (the text hit a stop string, or the caller stopped) is awaited by `settle` or
        `close`, and whatever it computed is never given out.

        Raises:
            Rewind: a peer was caught computing wrong: the route was rebuilt without it and rolled
                back (swarm/client/session.py `Rewound`); `token` was not sent.
            ValueError: a step was sent ahead for another token (`follow` said True for it).
        """
        try:
            t = self._loop.run(self._decode(token, follow), CALL_TIMEOUT_S)
        except Rewound as r:
            raise Rewind(r.position, StepResult(token=r.token.token, logprob=r.token.logprob,
                                                top=r.token.top)) from None
        return StepResult(token=t.token, logprob=t.logprob, top=t.top)

    async def _decode(self, token: int, follow: Callable[[int], bool] | None) -> Token:
        """`decode` on the loop: read the step sent ahead for `token`, or send it now; then send the
        next one ahead when `follow` says so."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.token != token:
            await _finished(ahead.task)
            raise ValueError(f"a decode step was sent ahead for token {ahead.token}, not {token}")
        t = await (ahead.task if ahead is not None else self._decode_step(token))
        if follow is not None and follow(t.token):
            self._ahead = _Ahead(t.token, self.route.pos, asyncio.ensure_future(self._decode_step(t.token)))
            # one turn of the loop, in which the step is sent (the task runs first, up to its wait
            # for the answer), before the caller's thread wakes and competes for the GIL
            await asyncio.sleep(0)
        return t

    def _decode_step(self, token: int) -> Awaitable[Token]:
        x = self._embedder.embed([token])
        return self.route.step(x, token_ids=np.array([token], np.int32), draft=True)

    def verify(self, token: int, draft: Sequence[int], group_rows: int | None,
               ahead: Callable[[], Sequence[int]] | None = None) -> list[StepResult]:
        """Send `token` and the drafted tokens as one verify pass in steps of `group_rows` rows (None:
        the route's proven exact group; swarm/spec/verify.py); keep the accepted rows on every hop.
        `ahead` is called (on a worker thread) once the pass is on its way; the tokens it returns
        (the guessed token after the draft, then drafted tokens after it) go out as the next pass
        right behind this one (pipelining, `RouteSession.step(ahead=...)`): a later call with
        exactly those tokens then only reads its answer.
        Returns the kept drafted tokens and the next sampled token (1..len(draft)+1, no log-probs).
        Raises:
            Rewind: as `decode`; nothing was sent."""
        x = self._embedder.embed([token, *draft])
        try:
            new = self._loop.run(self._verify(x, [token, *draft], group_rows, ahead), CALL_TIMEOUT_S)
        except Rewound as r:
            raise Rewind(r.position, StepResult(token=r.token.token)) from None
        return [StepResult(token=t) for t in new]

    def settle(self) -> Rewind | None:
        """Called when the generation has its last token: wait for a step sent ahead (`decode`) and
        the spot checks in flight. A `Rewind` when one caught a hop (the route was rebuilt without
        it and rolled back, as `decode` raises it): the tokens from its position on are replaced,
        and the generation goes on from its `step`; None: the tokens given out stand."""
        return self._loop.run(self._settle(), CALL_TIMEOUT_S)

    async def _settle(self) -> Rewind | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                await ahead.task
            except Rewound as r:
                # its token (at ahead.pos) was given out; what a roll-back past it replaces was not
                if r.position <= ahead.pos:
                    return Rewind(r.position, StepResult(token=r.token.token, logprob=r.token.logprob,
                                                         top=r.token.top))
            except SwarmError as e:  # its answer was never to be given out: the text stands
                logger.info("a decode step sent ahead and not needed failed: %s", e)
        t = await self.route.settle()
        if t is None:
            return None
        return Rewind(self.route.pos, StepResult(token=t.token, logprob=t.logprob, top=t.top))

    async def _verify(self, x, tokens: list[int], group_rows: int | None,
                      ahead: Callable[[], Sequence[int]] | None) -> list[int]:
        """Verify `tokens` (the last token, then the draft), embedded as `x`; keep the accepted rows."""

        async def rows_ahead() -> tuple[np.ndarray, np.ndarray] | None:
            try:
                guess = await asyncio.to_thread(ahead)
                return (self._embedder.embed(list(guess)), np.asarray(guess, dtype=np.int32)) if guess else None
            except Exception as e:  # noqa: BLE001 - a pass sent ahead is optional: this pass goes on
                logger.warning("no pass sent ahead: the guess failed: %s", e)
                return None

        t = await self.route.step(x, verify=True, group_rows=group_rows, token_ids=np.asarray(tokens, dtype=np.int32),
                                  draft=True, ahead=rows_ahead if ahead is not None else None)
        new = accepted(tokens[1:], t.tokens)
        self.route.keep(len(new))
        spec = self.route.telemetry.speculation
        if spec is not None:
            spec.ahead_sent, spec.ahead_used = self.route.ahead_sent, self.route.ahead_used
        return new

    def close(self) -> None:
        """Close the route's sessions on every peer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.on_close is not None:
            self.on_close(self)
        if self._loop.on_loop_thread:  # garbage-collected on the loop thread: cannot wait there
            self._loop.submit(self._close())
        else:
            self._loop.run(self._close(), CALL_TIMEOUT_S)

    async def _close(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # a step in flight owns the hops' streams until it ends
            await _finished(ahead.task)
        await self.route.close()


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A decode step sent ahead (`RemoteSession.decode`): its token, the token's position, the step."""

    token: int
    pos: int
    task: asyncio.Future[Token]


async def _finished(task: asyncio.Future) -> None:
    """Wait for `task` to end, whatever it ends with (a step sent ahead that nobody reads)."""
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: asyncio would log it as never retrieved
