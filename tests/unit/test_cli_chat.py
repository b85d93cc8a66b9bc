"""`swarm chat`'s printing (swarm/cli/chat.py `show`): deltas as they come, and a redraw only where a
repair changed text already printed (over the scripted engine of tests/helpers/scripted.py)."""

from __future__ import annotations

from swarm.cli.chat import REDRAWN, show
from swarm.client.generate import GenerationRequest, TokenStream

from tests.helpers.scripted import PROMPT, Letters, ScriptedEngine, ScriptedSession


def printed(honest: list[int], capsys) -> tuple[str, str, str]:
    """stdout, stderr and the final text of a generation that hands out a, b, c, d, then rolls back to
    two tokens and goes on with `honest`."""
    engine = ScriptedEngine(ScriptedSession([1, 2, 3, 4], 4, 2, honest))
    stream = TokenStream(engine, Letters(), PROMPT, GenerationRequest(max_new_tokens=6), backend="sim")
    show(stream)
    out, err = capsys.readouterr()
    return out, err, stream.result.text


def test_a_repair_that_changes_nothing_printed_is_not_redrawn(capsys):
    out, err, text = printed([1, 2, 3, 4, 5, 6], capsys)
    assert out == text == "abcdef" and err == ""


def test_a_repair_that_changes_printed_text_redraws_the_answer_below(capsys):
    out, err, text = printed([1, 2, 3, 9, 10, 11], capsys)
    assert text == "abcijk"
    assert out == "abcd\n" + "abc" + "ijk"  # the text that stands, redrawn on a new line, then the rest
    assert REDRAWN in err
