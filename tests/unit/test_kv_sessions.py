"""swarm.kv.sessions: admission, ownership, positions, eviction, seq-id reuse."""

import pytest

from swarm.errors import Busy, Forbidden, RequestError
from swarm.kv.sessions import SessionTable
from swarm.limits import MAX_CONTEXT_TOKENS

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def _table(**kw):
    args = {"max_sessions": 2, "cache_tokens": 1000, "idle_timeout_s": 60.0}
    args.update(kw)
    return SessionTable(**args)


def test_admit_reserves_tokens_and_lowest_seq_id():
    t = _table()
    a = t.admit(A, "alice", 300, now_s=0.0)
    b = t.admit(B, "bob", 200, now_s=1.0)
    assert (a.slot.seq_id, b.slot.seq_id) == (0, 1)
    assert a.evicted_seq_ids == () and a.slot.pos == 0
    assert t.unreserved_tokens == 500 and t.sessions_free == 0 and len(t) == 2
    assert t.free_cache_tokens == 0  # no slot left: a new session can reserve nothing here


def test_busy_when_no_seq_slot():
    t = _table()
    t.admit(A, "alice", 10, 0.0)
    t.admit(B, "alice", 10, 0.0)
    with pytest.raises(Busy, match="slots"):
        t.admit(C, "alice", 10, 1.0)


def test_busy_when_cache_does_not_fit():
    t = _table()
    t.admit(A, "alice", 900, 0.0)
    with pytest.raises(Busy, match="101 KV tokens, 100 are free"):
        t.admit(B, "bob", 101, 0.0)
    assert t.admit(B, "bob", 100, 0.0).slot.seq_id == 1


def test_admit_evicts_idle_sessions_first_and_reports_them():
    t = _table()
    t.admit(A, "alice", 900, 0.0)
    t.admit(B, "bob", 100, 30.0)
    adm = t.admit(C, "carol", 500, now_s=61.0)  # A idle 61 s > 60, B idle 31 s
    assert adm.evicted_seq_ids == (0,)
    assert adm.slot.seq_id == 0
    assert t.unreserved_tokens == 400
    with pytest.raises(RequestError, match="unknown session"):
        t.get(A, "alice")


def test_request_errors_on_admit():
    t = _table(max_session_tokens=512)
    with pytest.raises(RequestError, match="reserved_tokens"):
        t.admit(A, "alice", 513, 0.0)
    with pytest.raises(RequestError, match="reserved_tokens"):
        t.admit(A, "alice", 0, 0.0)
    with pytest.raises(RequestError, match="non-empty bytes"):
        t.admit(b"", "alice", 1, 0.0)
    t.admit(A, "alice", 1, 0.0)
    with pytest.raises(RequestError, match="already open"):
        t.admit(A, "alice", 1, 0.0)


def test_product_cap_is_the_default():
    t = _table(cache_tokens=1 << 20)
    with pytest.raises(RequestError):
        t.admit(A, "alice", MAX_CONTEXT_TOKENS + 1, 0.0)
    assert t.admit(A, "alice", MAX_CONTEXT_TOKENS, 0.0).slot.reserved_tokens == MAX_CONTEXT_TOKENS
    with pytest.raises(RequestError):
        SessionTable(1, 10, 1.0, max_session_tokens=MAX_CONTEXT_TOKENS + 1)


def test_get_checks_owner():
    t = _table()
    t.admit(A, "alice", 10, 0.0)
    assert t.get(A, "alice").seq_id == 0
    with pytest.raises(Forbidden, match="another client"):
        t.get(A, "mallory")
    with pytest.raises(RequestError, match="unknown session"):
        t.get(B, "alice")


def test_forward_positions_advance_and_truncate():
    t = _table()
    s = t.admit(A, "alice", 10, 0.0).slot
    t.check_forward(s, 0, 8)
    t.advance(s, 8, now_s=5.0)
    assert (s.pos, s.last_used_s) == (8, 5.0)
    with pytest.raises(RequestError, match="starts at position 7, session is at 8"):
        t.check_forward(s, 7, 1)
    with pytest.raises(RequestError, match="passes"):
        t.check_forward(s, 8, 3)
    with pytest.raises(RequestError, match="n_tokens"):
        t.check_forward(s, 8, 0)
    t.check_forward(s, 8, 2)
    t.truncate(s, 3)
    assert s.pos == 3
    with pytest.raises(RequestError, match="pos"):
        t.truncate(s, 4)
    with pytest.raises(RequestError, match="passes"):
        t.advance(s, 8, 6.0)
    assert s.pos == 3


def test_release_frees_slot_and_tokens_and_stale_slot_is_refused():
    t = _table()
    s = t.admit(A, "alice", 600, 0.0).slot
    t.admit(B, "bob", 400, 0.0)
    assert t.release(A) == 0
    assert (t.free_cache_tokens, t.sessions_free) == (600, 1)
    with pytest.raises(RequestError, match="closed"):
        t.advance(s, 1, 1.0)
    with pytest.raises(RequestError, match="unknown session"):
        t.release(A)
    assert t.admit(C, "carol", 600, 1.0).slot.seq_id == 0


def test_evict_idle_boundary_and_activity_keeps_alive():
    t = _table(max_sessions=3)
    a = t.admit(A, "alice", 10, 0.0).slot
    t.admit(B, "bob", 10, 0.0)
    t.advance(a, 1, now_s=50.0)
    assert t.evict_idle(60.0) == []  # idle exactly the timeout: kept
    assert t.evict_idle(60.5) == [1]  # bob idle 60.5 s
    assert t.evict_idle(110.5) == [0]
    assert len(t) == 0 and t.free_cache_tokens == 1000


@pytest.mark.parametrize(
    "kw", [{"max_sessions": 0}, {"cache_tokens": 0}, {"idle_timeout_s": 0}, {"idle_timeout_s": float("inf")}]
)
def test_bad_table_arguments(kw):
    with pytest.raises(RequestError):
        _table(**kw)


def test_session_cap_refuses_a_longer_session_with_both_numbers():
    t = _table(max_sessions=4, cache_tokens=1000, session_cap_tokens=250)
    with pytest.raises(Busy, match=r"needs 251 KV tokens, but a session here holds at most 250 "
                                   r"\(1000 cache tokens / 4 sessions\)"):
        t.admit(A, "alice", 251, 0.0)
    assert len(t) == 0 and t.unreserved_tokens == 1000  # nothing was taken
    assert t.admit(A, "alice", 250, 0.0).slot.reserved_tokens == 250


def test_session_cap_is_checked_before_evicting_idle_sessions():
    t = _table(max_sessions=1, cache_tokens=500, session_cap_tokens=500, idle_timeout_s=10.0)
    t.admit(A, "alice", 100, 0.0)
    with pytest.raises(Busy, match="at most 500"):
        t.admit(B, "bob", 501, now_s=100.0)  # A is idle, but B could never fit: A stays
    assert t.get(A, "alice").seq_id == 0


def test_free_cache_tokens_is_what_a_new_session_can_reserve():
    t = _table(max_sessions=4, cache_tokens=1000, session_cap_tokens=250)
    assert t.free_cache_tokens == 250  # an empty peer: the cap, not the 1000 free cells
    t.admit(A, "alice", 250, 0.0)
    t.admit(B, "bob", 250, 0.0)
    t.admit(C, "carol", 100, 0.0)
    assert (t.unreserved_tokens, t.free_cache_tokens) == (400, 250)
    t.admit(b"d" * 16, "dave", 1, 0.0)
    assert t.sessions_free == 0 and t.unreserved_tokens == 399
    assert t.free_cache_tokens == 0  # no slot: nothing, however many cells are unreserved
    t.release(C)
    assert t.free_cache_tokens == 250


def test_free_cache_tokens_below_the_cap_when_the_cache_runs_low():
    # a cap above cache_tokens / max_sessions (a shared cache): the unreserved tokens bind first
    t = _table(max_sessions=3, cache_tokens=1000, session_cap_tokens=600)
    t.admit(A, "alice", 600, 0.0)
    assert t.free_cache_tokens == 400
    with pytest.raises(Busy, match="401 KV tokens, 400 are free"):
        t.admit(B, "bob", 401, 0.0)


def test_without_a_session_cap_one_session_may_take_the_whole_cache():
    t = _table()
    assert t.session_cap_tokens == 1000 and t.free_cache_tokens == 1000
    assert t.admit(A, "alice", 1000, 0.0).slot.reserved_tokens == 1000


def test_bad_session_cap():
    with pytest.raises(RequestError, match="session_cap_tokens"):
        _table(session_cap_tokens=0)


def test_one_client_cannot_take_every_slot():
    t = _table(max_sessions=4, owner_sessions=2)
    t.admit(A, "greedy", 10, 0.0)
    t.admit(B, "greedy", 10, 0.0)
    with pytest.raises(Busy, match="client limit: .*client_sessions 2"):
        t.admit(C, "greedy", 10, 0.0)
    assert t.admit(C, "modest", 10, 0.0).slot.seq_id == 2  # another client still gets a slot


def test_one_client_cannot_reserve_the_whole_cache():
    t = _table(max_sessions=4, owner_tokens=500)
    t.admit(A, "greedy", 400, 0.0)
    with pytest.raises(Busy, match="client limit: .*client_kv_tokens 500"):
        t.admit(B, "greedy", 200, 0.0)
    assert t.admit(B, "modest", 500, 0.0).slot.reserved_tokens == 500
    t.release(A)
    assert t.admit(C, "greedy", 500, 0.0).slot.reserved_tokens == 500  # released tokens count no more
