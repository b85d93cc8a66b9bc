"""DeltaDecoder: UTF-8 characters split across tokens, and stop strings."""

from swarm.client.text import DeltaDecoder


def test_split_emoji_is_held_until_complete():
    d = DeltaDecoder()
    raw = "a😀b".encode()
    deltas = [d.feed(raw[i : i + 1]) for i in range(len(raw))]
    assert deltas == ["a", "", "", "", "😀", "b"]
    assert d.finish() == ""
    assert d.text == "a😀b"


def test_incomplete_character_at_end_becomes_replacement():
    d = DeltaDecoder()
    assert d.feed("中".encode()[:2]) == ""
    assert d.finish() == "\ufffd"


def test_stop_string_across_tokens_is_not_emitted():
    d = DeltaDecoder(stop=["</s>"])
    out = [d.feed(p) for p in (b"Hi <", b"/", b"s> more")]
    assert "".join(out) + d.finish() == "Hi "
    assert d.stopped and d.text == "Hi "
    assert d.feed(b"after") == ""


def test_held_back_prefix_released_when_stop_does_not_complete():
    d = DeltaDecoder(stop=["END"])
    assert d.feed(b"x E") == "x "
    assert d.feed(b"N") == ""
    assert d.feed(b"D") == ""
    assert d.stopped
    d2 = DeltaDecoder(stop=["END"])
    assert d2.feed(b"x E") == "x "
    assert d2.feed(b"go") == "Ego"
    assert not d2.stopped
