"""swarm.peer.rules: the peer's decisions that need no I/O, shared by the handler and sim/."""

import subprocess
import sys

import pytest

from swarm.kv.sessions import SessionTable
from swarm.limits import MAX_FORWARD_TOKENS
from swarm.peer import rules
from swarm.sampling import SamplingParams
from swarm.wire import ErrorCode, Open

MODEL = "a" * 64


def _open(client_id="client", model_id=MODEL, start=0, end=4) -> Open:
    return Open(session_id=b"s" * 16, client_id=client_id, model_id=model_id, start=start, end=end,
                max_tokens=16, sampling=SamplingParams())


def _refusal(frame, *, stream="client", shutting_down=False, draining=None, model_id=MODEL):
    return rules.open_refusal(frame, stream, shutting_down=shutting_down, draining=draining,
                              model_id=model_id, start=0, end=4)


def test_open_admitted_when_nothing_refuses():
    assert _refusal(_open()) is None


def test_open_refusals_in_order():
    wrong_everything = _open(client_id="other", model_id="b" * 64, start=1, end=3)
    assert _refusal(wrong_everything, shutting_down=True, draining="moving") == (
        ErrorCode.FORBIDDEN, "client_id does not match the stream's peer id")
    assert _refusal(wrong_everything, stream="other", shutting_down=True, draining="moving") == (
        ErrorCode.SHUTTING_DOWN, rules.SHUTTING_DOWN_MESSAGE)
    assert _refusal(wrong_everything, stream="other", draining="moving") == (ErrorCode.BUSY, "moving")
    assert _refusal(wrong_everything, stream="other") == (
        ErrorCode.NOT_FOUND, f"this peer serves layers [0, 4) of model {MODEL[:16]}")


def test_open_other_model_refused_unless_the_model_is_not_checked():
    frame = _open(model_id="b" * 64)
    assert _refusal(frame)[0] == ErrorCode.NOT_FOUND
    assert _refusal(frame, model_id=None) is None
    assert _refusal(_open(start=1), model_id=None) == (ErrorCode.NOT_FOUND, "this peer serves layers [0, 4)")


def test_restorable_lengths_leave_a_row_to_compute():
    offers = ((64, b"a"), (128, b"b"), (150, b"c"))
    assert rules.restorable_lengths(offers, {128: b"h", 64: b"g", 150: b"i"}) == (64, 128)
    assert rules.restorable_lengths((), {64: b"g"}) == ()


@pytest.mark.parametrize("pos0, rewind, pos, accepted, rewinds", [
    (5, False, 5, True, False),   # continues the session
    (3, False, 5, False, False),  # stale: the client finished that step by relay
    (3, True, 5, True, True),     # a rewind rolls the session back first
    (7, False, 5, False, False),  # ahead of the session
    (7, True, 5, False, False),   # a rewind never goes forward
    (5, True, 5, True, False),    # a rewind to where the session is: nothing to roll back
])
def test_pushed_steps_and_rewinds(pos0, rewind, pos, accepted, rewinds):
    assert rules.accepts_pushed(pos0, rewind, pos) is accepted
    assert rules.rewinds(pos0, rewind, pos) is rewinds


def test_forward_and_chain_refusals():
    assert rules.forward_size_refusal(MAX_FORWARD_TOKENS) is None
    assert "at most" in rules.forward_size_refusal(MAX_FORWARD_TOKENS + 1)
    assert rules.width_refusal(8, 8) is None
    assert rules.width_refusal(4, 8) == "hidden size 4 != span's 8"
    assert rules.chain_refusal("next", is_last=True) == "the last span samples: it pushes to no next hop"
    assert rules.chain_refusal("", is_last=True) is None
    assert rules.chain_refusal("next", is_last=False) is None


def test_truncate_and_restore_preconditions():
    assert rules.truncate_refusal(0, 0) is None
    assert rules.truncate_refusal(5, 5) is None
    assert rules.truncate_refusal(6, 5) == "truncate to 6: the session holds positions 0..4"
    assert rules.truncate_refusal(-1, 5) is not None
    assert rules.restore_refusal(0) is None
    assert rules.restore_refusal(3) == "restore only on a session's first step (the session is at 3)"
    assert "64 tokens" in rules.not_restorable(64)


def test_prefix_kept_once_when_the_whole_offered_prompt_is_cached():
    offers = ((64, b"a"), (100, b"b"))
    assert rules.keeps_prefix(offers, kept=False, session_pos=100)
    assert not rules.keeps_prefix(offers, kept=True, session_pos=100)
    assert not rules.keeps_prefix(offers, kept=False, session_pos=64)
    assert not rules.keeps_prefix((), kept=False, session_pos=0)


def test_span_record_announces_no_free_slot_while_draining():
    table = SessionTable(4, 1024, idle_timeout_s=600.0)
    speed = rules.Throughput(10.0, 100.0)
    r = rules.span_record("p", 0, 4, speed, table, draining=False, started_at=7.0)
    assert (r.peer_id, r.start, r.end) == ("p", 0, 4)
    assert (r.decode_steps_per_s, r.prefill_tokens_per_s) == (10.0, 100.0)
    assert (r.free_cache_tokens, r.sessions_free) == (table.free_cache_tokens, 4)
    assert (r.rtt_ms, r.incarnation) == (None, 7.0)
    assert rules.span_record("p", 0, 4, speed, table, draining=True).sessions_free == 0
    idle = rules.span_record("p", 0, 4, speed, None, draining=False)
    assert (idle.free_cache_tokens, idle.sessions_free, idle.incarnation) == (0, 0, 0.0)


def test_rules_import_no_io_module():
    code = ("import sys, swarm.peer.rules; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('hivemind', 'llama_cpp', 'libtorrent') or m.startswith(('swarm.dht', 'swarm.p2p', "
            "'swarm.ggml_bridge'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
