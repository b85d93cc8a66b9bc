"""swarm.peer.quotas: streams and frame bytes in flight per remote client, and the peer's caps."""

from __future__ import annotations

import pytest

from swarm.kv.sessions import CLIENT_LIMIT_PREFIX
from swarm.limits import MAX_FRAME_BYTES
from swarm.peer.quotas import SMALL_FRAME_BYTES, WAIT, ClientLedger, ClientLimits, limits_refusal

MIB = 1024 * 1024


def ledger(**kw) -> ClientLedger:
    args = {"streams": 2, "max_streams": 3, "bytes": 64 * MIB, "max_buffered_bytes": 128 * MIB}
    args.update(kw)
    return ClientLedger(ClientLimits(**args))


def test_a_client_past_its_streams_is_refused_naming_the_limit_and_others_still_open():
    led = ledger()
    assert led.open_stream("a") is None and led.open_stream("a") is None
    why = led.open_stream("a")
    assert why.startswith(CLIENT_LIMIT_PREFIX) and "client_streams 2" in why
    assert led.open_stream("b") is None
    assert led.streams == {"a": 2, "b": 1} and led.refusals == {"client_streams": 1}


def test_the_peer_wide_stream_cap_refuses_any_client_once_reached():
    led = ledger()
    for c in "abc":
        assert led.open_stream(c) is None
    assert "max_streams 3" in led.open_stream("d")
    led.close_stream("a")
    assert led.open_stream("d") is None and led.open_streams == 3


def test_frame_bytes_past_a_clients_budget_are_refused_before_the_body_is_read():
    led = ledger()
    assert led.reserve("a", 60 * MIB) is None
    why = led.reserve("a", 10 * MIB)
    assert why.startswith(CLIENT_LIMIT_PREFIX) and "client_bytes" in why
    assert led.reserved_bytes == 60 * MIB  # the refused frame reserved nothing


def test_frames_wait_while_the_peer_budget_is_full_and_pass_after_a_release():
    led = ledger()
    assert led.reserve("a", 60 * MIB) is None and led.reserve("b", 60 * MIB) is None
    assert led.reserve("c", 60 * MIB) == WAIT
    led.release("a", 60 * MIB)
    assert led.reserve("c", 60 * MIB) is None
    assert led.peak_reserved_bytes == 120 * MIB <= led.limits.max_buffered_bytes
    assert dict(led.bytes) == {"b": 60 * MIB, "c": 60 * MIB}


def test_a_small_frame_never_waits_behind_stalled_bulk_frames():
    led = ledger()
    assert led.reserve("a", 64 * MIB) is None and led.reserve("b", 64 * MIB) is None
    assert led.reserve("c", 2 * MIB) == WAIT
    assert led.reserve("c", SMALL_FRAME_BYTES) is None  # a decode step's frame passes
    assert led.reserved_bytes == 128 * MIB + SMALL_FRAME_BYTES


def test_24_concurrent_60_mib_frames_never_hold_more_than_the_budget():
    led = ClientLedger(ClientLimits())
    granted = [c for c in range(24) if led.reserve(f"client{c}", 60 * MIB) is None]
    assert len(granted) == led.limits.max_buffered_bytes // (60 * MIB)
    assert led.peak_reserved_bytes <= led.limits.max_buffered_bytes


def test_defaults_of_sessions_and_kv_tokens_are_half_of_the_span():
    assert ClientLimits().resolved(8, 16384) == ClientLimits(4, 8192)
    assert ClientLimits().resolved(1, 255).sessions == 1
    assert ClientLimits(sessions=6, kv_tokens=100).resolved(8, 16384) == ClientLimits(6, 100)


@pytest.mark.parametrize("limits, words", [
    (ClientLimits(streams=0), "client_streams"),
    (ClientLimits(sessions=0), "client_sessions"),
    (ClientLimits(bytes=MAX_FRAME_BYTES - 1), "client_bytes"),
    (ClientLimits(max_buffered_bytes=MAX_FRAME_BYTES, bytes=2 * MAX_FRAME_BYTES), "client_bytes"),
    (ClientLimits(streams=10, max_streams=5), "max_streams"),
])
def test_unservable_limits_are_refused(limits, words):
    assert words in limits_refusal(limits)


def test_default_limits_serve():
    assert limits_refusal(ClientLimits()) is None
