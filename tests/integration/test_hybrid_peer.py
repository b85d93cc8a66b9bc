"""A real peer serving a hybrid model (synthetic qwen35: recurrent and attention layers), whose
recurrent state cannot roll back into a sequence (`ArchRow.rollback_exact` is False).

A `Truncate` into the sequence must be refused with an error that leaves the session where its
cache is: the next step continues from the old position, not from the refused one.
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
    p = ps.start("p0", *serve_args(path, f"0:{N_LAYERS_HYBRID}", "--new-swarm", "--max-sessions", "2"))
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
