"""Raw copies of GGUF arrays and tensors (`swarm.ggml_bridge.gguf_raw`): the bytes written equal
what the `gguf` package's own writer packs element by element, through the raw path and through the
element-wise fallback a later `gguf` release would take; a truncated file is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.gguf_raw import RawArray, RawArrayWriter, add_raw_tensor, read_array, tensor_bytes

TOKENS = ["<s>", "héllo", "", "日本語", " world"]
SCORES = [0.5, -1.25, 3.0, 0.0, 7.5]
TYPES = [1, 2, 3, 1, 6]


def _write(path, writer_cls, arrays, tensors):
    w = writer_cls(path, "llama")
    w.add_uint32("llama.block_count", 2)
    for key, (values, sub) in arrays.items():
        w.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=sub)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("raw") / "src.gguf"
    rng = np.random.default_rng(0)
    arrays = {
        "tokenizer.ggml.tokens": (TOKENS, GGUFValueType.STRING),
        "tokenizer.ggml.scores": (SCORES, GGUFValueType.FLOAT32),
        "tokenizer.ggml.token_type": (TYPES, GGUFValueType.INT32),
    }
    q8 = rng.integers(0, 255, size=(3, 34 * 2), dtype=np.uint8)  # 3 rows of 64 Q8_0 elements
    tensors = {
        "a.weight": (rng.standard_normal((3, 5)).astype(np.float32), None),
        "b.weight": (q8, GGMLQuantizationType.Q8_0),
    }
    _write(path, GGUFWriter, arrays, tensors)
    return path


@pytest.mark.parametrize("writer_cls", [RawArrayWriter, GGUFWriter], ids=["raw", "element-wise"])
def test_arrays_and_tensors_copied_raw_are_the_same_file(source, tmp_path, writer_cls):
    header = scan(source)
    arrays = {k: (read_array(source, header, k), GGUFValueType(header.array_types[k]))
              for k in header.array_spans}
    data = np.memmap(source, dtype=np.uint8, mode="r")
    out = tmp_path / "copy.gguf"
    w = writer_cls(out, "llama")
    w.add_uint32("llama.block_count", 2)
    for key, (values, sub) in arrays.items():
        w.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=sub)
    for name, entry in header.tensors.items():
        add_raw_tensor(w, name, data, entry)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert out.read_bytes() == source.read_bytes()
    reread = GGUFReader(out)
    assert [bytes(reread.fields["tokenizer.ggml.tokens"].parts[i]).decode()
            for i in reread.fields["tokenizer.ggml.tokens"].data] == TOKENS
    assert reread.fields["tokenizer.ggml.scores"].contents() == SCORES


def test_a_raw_array_reads_as_its_elements(source):
    header = scan(source)
    tokens = read_array(source, header, "tokenizer.ggml.tokens")
    assert (len(tokens), list(tokens)) == (5, [t.encode() for t in TOKENS])
    assert list(read_array(source, header, "tokenizer.ggml.token_type")) == TYPES
    assert read_array(source, header, "tokenizer.ggml.scores")[1] == -1.25


def test_tensor_bytes_are_shaped_for_the_writer(source):
    header = scan(source)
    data = np.memmap(source, dtype=np.uint8, mode="r")
    f32 = tensor_bytes(data, header.tensors["a.weight"])
    assert f32.shape == (3, 20)  # 5 float32 per row
    expected = GGUFReader(source).tensors[0].data
    assert np.array_equal(f32.view(np.float32), expected)
    assert tensor_bytes(data, header.tensors["b.weight"]).shape == (3, 68)


def test_a_truncated_file_is_refused_by_name(source, tmp_path):
    header = scan(source)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(source.read_bytes()[:header.tensors["b.weight"].offset + 10])
    with pytest.raises(ModelError, match="runs past the file"):
        tensor_bytes(np.memmap(cut, dtype=np.uint8, mode="r"), header.tensors["b.weight"])
    start, _ = header.array_spans["tokenizer.ggml.tokens"]
    short = tmp_path / "short.gguf"
    short.write_bytes(source.read_bytes()[:start + 20])
    with pytest.raises(ModelError, match="ends inside the value of tokenizer.ggml.tokens"):
        read_array(short, header, "tokenizer.ggml.tokens")


def test_a_raw_array_needs_its_element_type_and_length():
    with pytest.raises(ValueError, match="at least 12 bytes"):
        RawArray(b"\x08\x00\x00\x00")
