"""swarm/api/service.py: which HTTP error each failure of a request becomes."""

import pytest

from swarm.api.openai_schema import ApiError
from swarm.api.service import RETRY_AFTER_S, api_error
from swarm.errors import Busy, NoRoute, PeerUnreachable, RequestError, ShuttingDown


@pytest.mark.parametrize(
    "error, status, code",
    [
        (RequestError("bad"), 400, None),
        (NoRoute("no chain", missing=(20,)), 503, "no_route"),
        (Busy("full"), 503, "busy"),
        (ShuttingDown("leaving"), 503, "busy"),
        (PeerUnreachable("gone"), 502, "swarm_error"),
        (RuntimeError("bug"), 500, None),
    ],
)
def test_failures_map_to_http_statuses(error, status, code):
    e = api_error(error)
    assert (e.status, e.code) == (status, code)
    assert ("Retry-After" in e.headers()) == (status == 503)
    if status == 503:
        assert e.headers()["Retry-After"] == str(RETRY_AFTER_S)


def test_an_api_error_stays_itself():
    e = ApiError(413, "too long", code="context_length_exceeded")
    assert api_error(e) is e
