"""swarm/numeric.py: the ubatch grid and which prefill chunk sizes keep every ubatch on it."""

import pytest

from swarm.errors import RequestError
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS
from swarm.numeric import UBATCH_TOKENS, check_chunk_tokens


def test_multiples_of_the_grid_pass():
    assert UBATCH_TOKENS == PREFIX_BLOCK_TOKENS == 64  # restores happen on the grid
    for chunk in (64, 128, 256, 512, 2048):
        assert check_chunk_tokens(chunk) == chunk


@pytest.mark.parametrize(
    "chunk, nearest",
    [(100, "use 64 or 128"), (1, "use 64"), (63, "use 64"), (257, "use 256 or 320")],
)
def test_off_grid_chunks_are_refused_naming_the_nearest(chunk, nearest):
    with pytest.raises(RequestError, match=f"prefill_chunk_tokens must be a multiple of 64 .*got {chunk}, {nearest}"):
        check_chunk_tokens(chunk)


@pytest.mark.parametrize("chunk", [0, -64, 64.0, True, "64", None])
def test_non_positive_or_non_integer_chunks_are_refused(chunk):
    with pytest.raises(RequestError, match="must be a positive multiple of 64"):
        check_chunk_tokens(chunk)
