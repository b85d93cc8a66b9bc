"""The generation loop's repair (swarm/client/generate.py): a session that rolls back (`Rewind`) has
its replaced tokens dropped, the recomputed text held back while it repeats what was given out, and a
`Correction` yielded only where the given-out text changes. Over `ScriptedEngine`
(tests/helpers/scripted.py), a named fake whose session rolls back at a chosen decode call.
"""

from __future__ import annotations

import pytest

from swarm.client.generate import Correction, GenerationRequest, TokenStream

from tests.helpers.scripted import PROMPT, Letters, ScriptedEngine, ScriptedSession, shown


def run(given, rewind_at, keep, honest, n_new):
    """Events of one generation, and the stream."""
    engine = ScriptedEngine(ScriptedSession(given, rewind_at, keep, honest))
    stream = TokenStream(engine, Letters(), PROMPT, GenerationRequest(max_new_tokens=n_new), backend="sim")
    return list(stream), stream


def test_recomputed_tokens_equal_to_the_given_out_ones_yield_no_correction():
    # tokens 1..4 given out; the 4th decode rolls back to 2 generated tokens, recomputed the same
    events, s = run([1, 2, 3, 4], 4, 2, [1, 2, 3, 4, 5, 6], 6)
    assert all(isinstance(e, str) for e in events)
    assert "".join(events) == s.result.text == "abcdef" and s.result.tokens == [1, 2, 3, 4, 5, 6]
    assert s.corrections == []
    assert s.result.telemetry.generated_tokens == 6  # the replaced tokens' latencies are dropped


def test_changed_text_is_withdrawn_from_the_first_difference_then_continues():
    events, s = run([1, 2, 3, 4], 4, 2, [1, 2, 3, 9, 10, 11], 6)
    [c] = [e for e in events if isinstance(e, Correction)]
    # the recomputed 3rd token repeats "c" (held back, not given twice); the 4th differs
    assert c == Correction(position=3, text="d", token_position=2, tokens=(3, 4))
    assert events[events.index(c) + 1] == "i"
    assert shown(events) == s.result.text == "abcijk" and s.result.tokens == [1, 2, 3, 9, 10, 11]
    assert s.corrections == [c]


def test_a_recomputation_that_ends_sooner_withdraws_the_rest():
    events, s = run([1, 2, 3, 4], 4, 2, [1, 2, 3, 0], 6)
    assert events[-1] == Correction(position=3, text="d", token_position=2, tokens=(3, 4))
    assert shown(events) == s.result.text == "abc" and s.result.telemetry.finish_reason == "stop"


@pytest.mark.parametrize("keep, text", [(0, "abcd"), (1, "dbcd")])
def test_a_rollback_to_the_first_tokens(keep, text):
    events, s = run([4, 4, 4], 3, keep, [1, 2, 3, 4], 4)
    [c] = [e for e in events if isinstance(e, Correction)]
    assert c == Correction(position=keep, text="ddd"[keep:], token_position=keep, tokens=(4, 4, 4)[keep:])
    assert shown(events) == s.result.text == text and len(s.result.tokens) == 4


def test_a_rollback_after_the_last_token_repairs_the_text_and_generates_on():
    """A spot check's verdict that comes after the last token (`settle`) still rolls the text back:
    the wrong tokens are withdrawn and the generation goes on to the requested length."""
    events, s = run([1, 2, 3, 4], 0, 2, [1, 2, 3, 9, 10, 11], 4)
    [c] = [e for e in events if isinstance(e, Correction)]
    assert c == Correction(position=3, text="d", token_position=2, tokens=(3, 4))
    assert shown(events) == s.result.text == "abci" and s.result.tokens == [1, 2, 3, 9]
    assert s.result.telemetry.finish_reason == "length" and s.result.telemetry.generated_tokens == 4


def test_a_rollback_after_the_end_token_recomputes_past_it():
    """The wrong text had ended (token 0); the recomputed one goes on to the length."""
    events, s = run([1, 2, 0], 0, 1, [1, 5, 6, 7], 4)
    assert shown(events) == s.result.text == "aefg" and s.result.telemetry.finish_reason == "length"
