"""Prompt lookup drafts and the MTP head's drafts (swarm/spec/draft.py)."""

from __future__ import annotations

import pytest

from swarm.client.telemetry import GenerationTelemetry
from swarm.spec.draft import HeadDrafts, PromptLookup


def test_proposes_what_followed_the_latest_earlier_match_of_the_longest_suffix():
    # "5 6" recurs twice; the latest earlier match (index 4) is followed by 9 9, the first by 7 8
    tokens = [1, 5, 6, 7, 8, 5, 6, 9, 9, 3, 5, 6]
    assert PromptLookup(max_ngram=2).propose(tokens, 2) == [9, 9]
    assert PromptLookup(max_ngram=2).propose(tokens, 10) == [9, 9, 3, 5, 6]


def test_a_longer_suffix_match_wins_over_a_later_shorter_one():
    # suffix "4 5 6": matched at 0 (then 7); "5 6" alone was seen later, followed by 2
    tokens = [4, 5, 6, 7, 1, 5, 6, 2, 4, 5, 6]
    assert PromptLookup(max_ngram=3).propose(tokens, 1) == [7]
    assert PromptLookup(max_ngram=2, min_ngram=2).propose(tokens, 1) == [2]


def test_no_recurring_suffix_proposes_nothing():
    assert PromptLookup().propose([1, 2, 3, 4], 4) == []
    assert PromptLookup().propose([7], 4) == []
    assert PromptLookup().propose([1, 2, 1, 2], 0) == []


def test_bad_ngram_bounds_are_refused():
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError):
        PromptLookup(min_ngram=0)


def test_head_drafts_propose_the_routes_guess_for_the_next_position_only():
    telemetry = GenerationTelemetry(backend="swarm")
    d = HeadDrafts()
    d.attach(telemetry)
    tokens = [5, 6, 7]  # the route holds positions 0..1; token 7 at 2 is fed next
    assert d.propose(tokens, 4) == []  # no guess answered yet: a plain step
    telemetry.mtp_drafts[3] = (9,)  # the head's guess of the token at position 3
    assert d.propose(tokens, 4) == [9] and d.propose(tokens, 0) == []
    assert d.propose([*tokens, 9], 4) == []  # a guess is for one position
    telemetry.mtp_drafts[4] = (8, 1)  # a head of two blocks: two positions
    assert d.propose([*tokens, 9], 1) == [8] and d.propose([*tokens, 9], 4) == [8, 1]
