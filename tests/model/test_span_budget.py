"""swarm.kv.budget.span_budget on the real models' manifests: bytes that llama.cpp would hold."""

from swarm.kv.budget import span_budget
from swarm.manifest import build_manifest

MiB = 1024 * 1024


def test_smollm2_budget_counts_every_tensor_once_and_llama_cpp_kv(smollm2_path):
    m = build_manifest(smollm2_path)
    b = span_budget(m, memory_bytes=1 << 40, kv_tokens=4096)
    assert b.n_layers == 30
    assert b.kv_bytes_per_layer_token == 768  # 3 KV heads x (64 + 64) x f16
    # tied head: the last span carries token_embd as its output matrix; nothing else is outside the blocks
    assert sum(b.layer_bytes) + b.head_bytes == sum(t.nbytes for t in m.tensors)
    assert b.span_bytes(0, 30) == sum(t.nbytes for t in m.tensors) + 90 * MiB  # llama.cpp: 90 MiB KV at 4096


def test_qwen_budget_sizes_a_span_by_memory(qwen_path):
    m = build_manifest(qwen_path)
    b = span_budget(m, memory_bytes=0, kv_tokens=16384)
    assert b.kv_bytes_per_layer_token == 512  # 2 KV heads x (64 + 64) x f16 (llama.cpp: 384 MiB at 32768)
    per_layer = b.span_bytes(0, 1)
    assert per_layer == b.layer_bytes[0] + 512 * 16384
    room = span_budget(m, memory_bytes=8 * per_layer + per_layer // 2, kv_tokens=16384)
    assert room.longest_end(0) == 8  # layers are the same size: 8 of them fit, a ninth does not
    # the separate output head is big (151,936 x 896): the last span needs room for it too
    assert b.head_bytes > 4 * b.layer_bytes[0]
    assert not room.fits(16, 24) and room.longest_end(16) < 24
