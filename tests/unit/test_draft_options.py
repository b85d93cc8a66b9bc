"""Choosing a draft model, refused early when it cannot work; the tokenizer check on GGUF headers.

The GGUFs here hold only tokenizer metadata (written by the `gguf` package): the check reads
headers, never weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFWriter

from swarm import Client
from swarm.client.draftmodel import check_draft_option, check_same_tokenizer
from swarm.errors import ModelError, RequestError

TOKENS = ["<unk>", "a", "b", "ab", "abc"]
MERGES = ["a b", "ab c"]


def tokenizer_gguf(path: Path, model: str = "gpt2", tokens=TOKENS, merges=MERGES) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", model)
    if tokens is not None:
        w.add_array("tokenizer.ggml.tokens", tokens)
    if merges is not None:
        w.add_array("tokenizer.ggml.merges", merges)
    w.add_string("tokenizer.chat_template", f"{{{{ messages }}}} {path.name}")  # not compared
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_same_vocabulary_merges_and_type_may_draft(tmp_path):
    check_same_tokenizer(tokenizer_gguf(tmp_path / "d.gguf"), tokenizer_gguf(tmp_path / "t.gguf"))
    # SentencePiece vocabularies have no merges: none on either side is the same
    check_same_tokenizer(tokenizer_gguf(tmp_path / "d2.gguf", "llama", merges=None),
                         tokenizer_gguf(tmp_path / "t2.gguf", "llama", merges=None))


@pytest.mark.parametrize(
    "draft, why",
    [
        (dict(tokens=["<unk>", "a", "b", "ab", "abd"]),
         "tokenizer.ggml.tokens: 5 entries each, not the same"),
        (dict(tokens=TOKENS[:4]), "tokenizer.ggml.tokens: 4 vs 5 entries"),
        (dict(merges=["a b", "ab d"]), "tokenizer.ggml.merges: 2 entries each, not the same"),
        (dict(merges=None), "tokenizer.ggml.merges only in the target"),
        (dict(model="llama"), "tokenizer.ggml.model 'llama' vs 'gpt2'"),
    ],
)
def test_another_tokenizer_is_refused_naming_the_difference(tmp_path, draft, why):
    d, t = tokenizer_gguf(tmp_path / "d.gguf", **draft), tokenizer_gguf(tmp_path / "t.gguf")
    with pytest.raises(ModelError, match="a draft model must have the target's tokenizer") as e:
        check_same_tokenizer(d, t)
    assert f"its tokenizer differs ({why})" in str(e.value)


def test_a_gguf_without_a_vocabulary_is_refused(tmp_path):
    with pytest.raises(ModelError, match=r"has no vocabulary \(tokenizer.ggml.tokens\)"):
        check_same_tokenizer(tokenizer_gguf(tmp_path / "d.gguf", tokens=None),
                             tokenizer_gguf(tmp_path / "t.gguf"))


@pytest.mark.parametrize(
    "draft, err, needle",
    [
        ("self:Q9_X", ModelError, "unknown self-draft type 'Q9_X': one of Q2_K, Q3_K_S, Q3_K_M"),
        ("/nonexistent/draft.gguf", ModelError,
         "draft '/nonexistent/draft.gguf': model file not found: /nonexistent/draft.gguf"),
        ("", RequestError, "draft must be 'lookup', 'mtp', 'self', 'self:TYPE' or a .gguf path"),
    ],
)
def test_a_draft_that_cannot_work_is_refused_before_the_swarm_is_joined(draft, err, needle):
    # no peers to join through and no model: reaching either would be another error
    with pytest.raises(err) as e:
        Client("/nonexistent/never-loaded.gguf", draft=draft)
    assert needle in str(e.value)


def test_a_draft_model_needs_the_swarm():
    with pytest.raises(RequestError, match="a draft model speculates over the swarm"):
        Client("/nonexistent/never-loaded.gguf", local=True, draft="self")


def test_lookup_and_self_are_options():
    check_draft_option("lookup")
    check_draft_option("self")
    check_draft_option("self:Q2_K")
