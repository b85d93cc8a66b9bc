"""A real peer serving a hybrid model (synthetic qwen35: recurrent and attention layers), whose
recurrent state cannot roll back into a sequence (`ArchRow.rollback_exact` is False).

A `Truncate` into the sequence must be refused with an error that leaves the session where its
cache is: the next step continues from the old position, not from the refused one. Only the rows
of a verify pass roll back, from the state the peer exported before it (swarm/peer/checkpoints.py),
exactly as if they had never been computed.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.manifest import build_manifest
from swarm.wire import Error, Forward, Token, Truncate, encode_frame
from tests.helpers.synthetic import N_EMBD, N_LAYERS_HYBRID, write_synthetic

from tests.helpers.peers import PeerSet, RawClient, serve_args


def hidden(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, N_EMBD)) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    path = write_synthetic("qwen35", tmp_path_factory.mktemp("hybrid") / "qwen35.gguf")
    ps = PeerSet(tmp_path_factory.mktemp("hybrid_peer"))
    p = ps.start("p0", *serve_args(path, f"0:{N_LAYERS_HYBRID}", "--new-swarm", "--max-sessions", "5"))
    c = RawClient(p, build_manifest(path).model_id, tmp_path_factory.mktemp("raw"), span=(0, N_LAYERS_HYBRID))
    yield c
    c.close()
    ps.stop_all()
    assert p.proc.returncode == 0, p.stderr_text()[-2000:]


def test_synthetic_hybrid_truncate_into_the_sequence_is_refused_and_the_session_stays_put(raw):
    s = raw.open_session()
    assert isinstance(raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=hidden(4)))), Token)
    reply = raw.ask(s, encode_frame(Truncate(pos=2)))
    assert isinstance(reply, Error), reply
    # the session table still says 4 (where the cache is): position 4 is next, position 2 is not
    refused = raw.ask(s, encode_frame(Forward(step=1, pos0=2, hidden=hidden(1, 1))))
    assert isinstance(refused, Error) and "position 2" in refused.message, refused
    after = raw.ask(s, encode_frame(Forward(step=2, pos0=4, hidden=hidden(1, 2))))
    assert isinstance(after, Token), after


def test_synthetic_hybrid_rolls_a_verify_pass_back_from_its_checkpoint(raw):
    """A verify pass exports the session's state first (swarm/peer/checkpoints.py): rolling back to
    a row inside it (`Forward.rewind`) imports that state and computes the kept rows again, so the
    next step's logits equal those of a session that never computed the rejected rows."""
    prompt, rows, nxt = hidden(4), hidden(4, 3), hidden(1, 4)
    a, b = raw.open_session(), raw.open_session()
    for s in (a, b):
        assert isinstance(raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=prompt))), Token)
    passed = raw.ask(a, encode_frame(Forward(step=1, pos0=4, hidden=rows, verify=True, steps=(1, 1, 1, 1))))
    assert isinstance(passed, Token) and len(passed.tokens) == 4, passed
    got = raw.ask(a, encode_frame(Forward(step=2, pos0=6, hidden=nxt, rewind=True, want_logits=True)))
    assert isinstance(got, Token), got  # a generation-8 peer refused this rewind
    for i in range(2):  # plain decoding of the two kept rows
        step = Forward(step=1 + i, pos0=4 + i, hidden=rows[i : i + 1])
        assert isinstance(raw.ask(b, encode_frame(step)), Token)
    want = raw.ask(b, encode_frame(Forward(step=3, pos0=6, hidden=nxt, want_logits=True)))
    assert np.array_equal(got.logits, want.logits)
    # a rollback past the checkpoint (into the prompt) is still refused, and the session stays put
    assert isinstance(raw.ask(a, encode_frame(Truncate(pos=2))), Error)
    assert isinstance(raw.ask(a, encode_frame(Forward(step=3, pos0=7, hidden=nxt))), Token)


def test_synthetic_hybrid_a_verify_pass_failing_half_way_or_in_unproved_groups_keeps_the_session_usable(raw):
    """A verify pass whose last row is refused after the rows before it were computed is rolled back
    from its checkpoint (the scheduler's undo truncates, which this cache refuses), so the session
    goes on from where its table says; a pass in groups larger than the span's proved `verify_rows`
    cannot be recomputed as it was, so a rollback into it is refused rather than done inexactly."""
    prompt, rows, nxt = hidden(4), hidden(4, 3), hidden(1, 4)
    a, b = raw.open_session(), raw.open_session()
    for s in (a, b):
        assert isinstance(raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=prompt))), Token)
    bad = rows.copy()
    bad[3] = np.inf
    refused = raw.ask(a, encode_frame(Forward(step=1, pos0=4, hidden=bad, verify=True, steps=(1, 1, 1, 1))))
    assert isinstance(refused, Error) and "infinite" in refused.message, refused
    got = raw.ask(a, encode_frame(Forward(step=2, pos0=4, hidden=nxt, want_logits=True)))
    want = raw.ask(b, encode_frame(Forward(step=1, pos0=4, hidden=nxt, want_logits=True)))
    assert isinstance(got, Token) and np.array_equal(got.logits, want.logits), got

    one_group = raw.ask(a, encode_frame(Forward(step=3, pos0=5, hidden=rows, verify=True)))  # 4 rows > 1
    assert isinstance(one_group, Token) and len(one_group.tokens) == 4, one_group
    assert isinstance(raw.ask(a, encode_frame(Truncate(pos=7))), Error)
    assert isinstance(raw.ask(a, encode_frame(Forward(step=4, pos0=9, hidden=nxt))), Token)  # still at 9
