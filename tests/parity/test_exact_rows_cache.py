"""The probes' answers kept beside the span file (swarm/peer/exact_rows.py `exact_rows`): a span
opened again on the same inputs is not probed again, and any input that changes (the executor's
settings, the span file, a damaged cache) makes it probe. Synthetic llama spans, real llama.cpp."""

from __future__ import annotations

import json
import os

import pytest

from swarm.ggml_bridge.executor import SpanExecutor
from swarm.peer import exact_rows as exact_module
from swarm.peer.exact_rows import ExactRows, exact_batch_cap, exact_rows, probe_exact_step_rows, probe_key
from tests.helpers.synthetic import write_synthetic


def _open(model, cache, n_seq_max=8):
    return SpanExecutor.for_span(model, 0, 3, n_ctx_tokens=256 * n_seq_max, n_seq_max=n_seq_max, n_threads=1,
                                 cache_dir=cache)


def test_a_span_opened_again_on_the_same_inputs_is_not_probed_again(tmp_path, monkeypatch):
    model = write_synthetic("llama", tmp_path / "llama.gguf")
    cache = tmp_path / "spans"
    with _open(model, cache) as ex:
        want = ExactRows(exact_batch_cap(ex), probe_exact_step_rows(ex))
        assert exact_rows(ex) == want
        entries = json.loads(ex.span_path.with_suffix(".exact.json").read_text())
        assert entries == {probe_key(ex): {"batch_cap": want.batch_cap, "verify_rows": want.verify_rows}}

    def probed(*_a, **_k):
        raise AssertionError("probed")

    monkeypatch.setattr(exact_module, "exact_batch_cap", probed)
    monkeypatch.setattr(exact_module, "probe_exact_step_rows", probed)
    with _open(model, cache) as ex:
        assert exact_rows(ex) == want  # from the cache: the probes would raise
        cache_file = ex.span_path.with_suffix(".exact.json")
        span_path = ex.span_path
    with _open(model, cache, n_seq_max=4) as ex, pytest.raises(AssertionError, match="probed"):
        exact_rows(ex)  # other settings: other kernels may run
    st = span_path.stat()
    os.utime(span_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with _open(model, cache) as ex, pytest.raises(AssertionError, match="probed"):
        exact_rows(ex)  # the span file was written again
    cache_file.write_text(json.dumps({"x": 1}))
    with _open(model, cache) as ex:
        cache_file.write_text(json.dumps({probe_key(ex): {"batch_cap": 0, "verify_rows": 99}}))
        with pytest.raises(AssertionError, match="probed"):
            exact_rows(ex)  # an answer no probe could give: probed again
