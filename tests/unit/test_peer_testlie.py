"""The test-only lying modes of a peer (swarm/peer/testlie.py): reachable only through SWARM_TEST_LIE."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.peer.testlie import ENV, NOISE_SCALE, SEED_ENV, Liar, from_env


def out(rows: int = 8) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32)


def test_no_variable_no_liar():
    assert from_env({}) is None
    assert from_env({ENV: ""}) is None


def test_modes_are_parsed_and_warned_about(capsys):
    assert from_env({ENV: "noise"}) == Liar(every=1)
    assert from_env({ENV: "noise:10"}) == Liar(every=10)
    assert from_env({ENV: "lazy:q3_k_m"}) == Liar(lazy="Q3_K_M")
    assert from_env({ENV: "noise:10", SEED_ENV: "7"}) == Liar(every=10, seed=7)
    assert from_env({ENV: "transit"}) == Liar(transit=True)
    assert capsys.readouterr().err.count("WRONG hidden states on purpose") == 5
    for bad in ("noise:0", "lazy", "honest"):
        with pytest.raises(ValueError):
            from_env({ENV: bad})


def test_noise_on_every_step_changes_every_row_by_about_its_scale():
    x = out()
    lied = Liar(every=1).corrupt(x, 0, (1,) * 8)
    rel = np.linalg.norm(lied - x, axis=1) / np.linalg.norm(x, axis=1)
    assert np.all((rel > NOISE_SCALE / 2) & (rel < NOISE_SCALE * 2))


def test_one_in_n_lies_on_the_same_positions_in_every_session_and_grouping():
    liar = Liar(every=10)
    x = out(64)
    one_step_each = liar.corrupt(x, 100, (1,) * 64)
    lied_rows = [i for i in range(64) if not np.array_equal(one_step_each[i], x[i])]
    assert lied_rows == [i for i in range(64) if liar.lies_at(100 + i)]
    assert 1 <= len(lied_rows) <= 20
    assert np.array_equal(liar.corrupt(x, 100, (1,) * 64), one_step_each)  # repeatable


def test_a_lazy_liar_adds_no_noise():
    x = out()
    assert Liar(lazy="Q2_K").corrupt(x, 0, ()) is x
