"""`swarm.Client`: generate, stream and chat, on the swarm or on a local whole model.

The two backends share one generation loop (`swarm.client.generate`), so they differ only in
where the next token is computed: `local=True` runs the whole model in this process; otherwise
the client finds a route of peers through the DHT and keeps one stream per hop for the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from swarm.client.generate import Generation, GenerationRequest, Speculation, TokenStream, check_request
from swarm.client.text import check_utf8
from swarm.client.tokenizer import Tokenizer
from swarm.errors import RequestError
from swarm.limits import MAX_CONTEXT_TOKENS, MTP_MAX_DRAFTS
from swarm.models import DEFAULT_MODEL, is_model_id, resolve_model
from swarm.sampling import SamplingParams
from swarm.spec.draft import Draft, HeadDrafts, PromptLookup


class Client:
    """A language-model client.

    Args:
        model: a known model name (`swarm models list`), a `.gguf` path, or (swarm only) a model_id.
        local: run the whole model in this process instead of on the swarm.
        initial_peers: multiaddrs of swarm peers to join the DHT through (swarm only).
        n_threads: llama.cpp threads for prompt ubatches (local only); default all cores. Each
            generated token runs on 1 thread (the numeric contract, swarm/numeric.py).
        n_ctx: KV-cache tokens (local only); default the model's context, capped at 131,072.
        prefill_chunk_tokens: prompt tokens per prefill frame (swarm only): a multiple of the ubatch
            grid, `swarm.numeric.UBATCH_TOKENS` (64).
        verify_group_rows: rows per step of a speculative verify pass (swarm/spec/verify.py); None
            (default): the largest group the route's peers proved exact at load.
        adaptive_speculation: with `speculate` k, draft 0..k tokens per pass, as this generation's
            measured acceptance and pass times say is fastest (swarm/spec/policy.py; 0 turns
            speculation off while it would be slower); False: always up to k.
        pipeline_speculation: send the next verify pass before the one in flight comes back, where
            it is likely to be used (swarm/client/generate.py `Speculation.pipeline`); False: one
            pass at a time.
        draft: where `speculate` gets its guesses (swarm only): "lookup" (default), prompt lookup,
            no model; "self", the model requantized to Q3_K_M and run greedily in this process
            (made once into the cache, swarm/client/draftmodel.py); "self:TYPE", another type
            (Q2_K, Q4_0, ...); "mtp", the model's own multi-token-prediction head, served on the
            route's last span (min(speculate, 8) chained guesses per pass; models whose GGUF keeps
            MTP blocks the swarm serves: deepseek4, deepseek2, glm-dsa, qwen35, qwen35moe); or the
            path of a draft GGUF with the model's tokenizer.
        draft_threads: the draft model's llama.cpp threads; default 1.
    Raises:
        RequestError: prefill_chunk_tokens off the grid (`swarm.numeric.check_chunk_tokens`), a
            draft other than lookup with local=True, or "mtp" for a model without a served MTP head.
        ModelError: the model cannot be found, fetched or loaded; the draft model cannot be made or
            loaded, or its tokenizer is not the model's.
        NoRoute: (swarm) no chain of peers covers every layer.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        local: bool = False,
        initial_peers: Sequence[str] = (),
        n_threads: int | None = None,
        n_ctx: int | None = None,
        prefill_chunk_tokens: int = 256,
        verify_group_rows: int | None = None,
        adaptive_speculation: bool = True,
        pipeline_speculation: bool = True,
        draft: str = "lookup",
        draft_threads: int | None = None,
    ):
        self.local = local
        self.verify_group_rows = verify_group_rows
        self.adaptive_speculation = adaptive_speculation
        self.pipeline_speculation = pipeline_speculation
        if not isinstance(draft, str) or not draft:
            raise RequestError(
                f"draft must be 'lookup', 'mtp', 'self', 'self:TYPE' or a .gguf path, got {draft!r:.80}"
            )
        if local and draft != "lookup":
            raise RequestError("a draft model speculates over the swarm: local=True has no route to "
                               "save round trips on")
        if draft not in ("lookup", "mtp"):
            from swarm.client.draftmodel import check_draft_option

            check_draft_option(draft)  # before joining the swarm: a bad option costs nothing
        self._draft_weights = None
        self._head_drafts = draft == "mtp"
        if local:
            from swarm.client.local import LocalEngine, open_local_model

            llama = open_local_model(resolve_model(model, progress=True), n_threads=n_threads)
            self.tokenizer = Tokenizer(llama)
            self._engine = LocalEngine(llama, n_ctx=n_ctx)
            self._backend = "local"
        else:
            from swarm.client.remote import connect_swarm

            self.tokenizer, self._engine = connect_swarm(
                model, list(initial_peers), prefill_chunk_tokens=prefill_chunk_tokens
            )
            self._backend = "swarm"
            if self._head_drafts:
                self._use_head_drafts()
            elif draft != "lookup":
                from swarm.client.draftmodel import load_draft

                try:
                    self._draft_weights = load_draft(draft, self._engine.model_path,
                                                     self._engine.manifest.model_id,
                                                     whole=not is_model_id(model), n_threads=draft_threads)
                except BaseException:
                    self.close()
                    raise

    def stream(
        self,
        prompt: str,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        speculate: int = 0,
    ) -> TokenStream:
        """Generate from a plain prompt, yielding text deltas as tokens arrive.

        Each delta decodes as UTF-8 on its own; they concatenate to `.result.text`.
        `speculate` k > 0 (swarm only): speculative decoding with up to k drafted tokens per verify
        pass (swarm/spec/); the text is the same as without it, token for token.
        Raises:
            RequestError: empty prompt, text that is not valid UTF-8 (a lone surrogate, or bytes
                that were not UTF-8), max_new_tokens not an integer >= 1, bad sampling values
                (`swarm.sampling.SamplingParams`), or prompt + max_new_tokens over the context.
        """
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("empty prompt")
        return self._stream(
            self.tokenizer.encode(prompt), max_new_tokens, temperature, top_p, top_k, seed, stop,
            speculate,
        )

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        speculate: int = 0,
    ) -> Generation:
        """Generate from a plain prompt; return text, token ids and Generation Telemetry."""
        return self.stream(prompt, max_new_tokens, temperature, top_p, top_k, seed, stop, speculate).run()

    def chat_stream(
        self,
        messages: Sequence[dict],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        speculate: int = 0,
    ) -> TokenStream:
        """Like `stream`, for chat messages rendered with the model's chat template."""
        return self._stream(
            self.tokenizer.chat_prompt(messages), max_new_tokens, temperature, top_p, top_k, seed, stop,
            speculate,
        )

    def chat(
        self,
        messages: Sequence[dict],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        speculate: int = 0,
    ) -> Generation:
        """Answer chat `messages` ([{"role": ..., "content": ...}]); return the finished generation."""
        return self.chat_stream(
            messages, max_new_tokens, temperature, top_p, top_k, seed, stop, speculate
        ).run()

    @property
    def context_limit(self) -> int:
        """Tokens (prompt + generated) one generation may hold: the model's context, at most 131,072."""
        return min(self._engine.context_limit, MAX_CONTEXT_TOKENS)

    def session_room(self) -> int | None:
        """Tokens (prompt + generated) a generation started now could hold, at most `context_limit`:
        locally `context_limit`; on the swarm, the most the best route's peers take per session now
        (each peer announces what a new session may reserve there: at most its per-session cap,
        `--cache-tokens / --max-sessions`), or None when no complete route exists.

        Raises:
            SwarmError: (swarm) the DHT did not answer.
        """
        room = self._engine.session_room()
        return None if room is None else min(room, self.context_limit)

    def stream_tokens(
        self,
        tokens: Sequence[int],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        speculate: int = 0,
    ) -> TokenStream:
        """Like `stream`, from prompt token ids (e.g. `self.tokenizer.chat_prompt(messages)`).

        Raises:
            RequestError: as `stream` (no tokens, bad sampling values, over the context).
        """
        return self._stream(list(tokens), max_new_tokens, temperature, top_p, top_k, seed, stop, speculate)

    def _draft(self, n_tokens: int) -> Draft:
        """A new draft for one generation of at most `n_tokens` tokens (prompt + generated)."""
        if self._head_drafts:
            return HeadDrafts()
        if self._draft_weights is None:
            return PromptLookup()
        return self._draft_weights.draft(n_tokens)

    def _use_head_drafts(self) -> None:
        """Check that the route's last span can answer its MTP head's drafts (`draft="mtp"`); each
        request that speculates asks for them (`stream`).

        Raises:
            RequestError: the model has no MTP block, or the swarm does not serve its architecture's
                head (`ArchRow.mtp_head`).
        """
        manifest = self._engine.manifest
        if not manifest.mtp_head_tensors():
            self.close()
            raise RequestError(f"draft 'mtp': the model ({manifest.arch}) has no multi-token-prediction "
                               "head that the swarm serves; use lookup, self or a draft .gguf")

    def close(self) -> None:
        """Release the swarm connection (a no-op for the local backend)."""
        closer = getattr(self._engine, "close", None)
        if closer is not None:
            closer()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stream(
        self,
        tokens: list[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int,
        stop: Sequence[str],
        speculate: int = 0,
    ) -> TokenStream:
        if isinstance(stop, (str, bytes)):
            raise RequestError("stop must be a list of strings")
        try:
            stop = tuple(check_utf8(s, f"stop string {i}") for i, s in enumerate(stop))
        except TypeError:
            raise RequestError("stop must be a list of strings") from None
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        req = GenerationRequest(max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop))
        if speculate:
            check_request(len(tokens), req, self._engine.context_limit)  # the draft is sized by it
            req = dataclasses.replace(req, speculation=Speculation(
                self._draft(len(tokens) + max_new_tokens), k=speculate, group_rows=self.verify_group_rows,
                adaptive=self.adaptive_speculation, pipeline=self.pipeline_speculation))
        if self._head_drafts:  # as many chained guesses as the request verifies per pass; none unused
            ok = isinstance(speculate, int) and speculate > 0  # else refused with the request below
            self._engine.mtp_drafts = min(speculate, MTP_MAX_DRAFTS) if ok else 0
        return TokenStream(self._engine, self.tokenizer, tokens, req, backend=self._backend)
