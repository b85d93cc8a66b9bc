"""PyTorch reference of a span of blocks, from dequantized GGUF weights, to validate architectures.

An independent implementation of the llama/qwen2 block (RMSNorm, rotary attention with grouped
KV heads, SwiGLU MLP) written from the architectures' papers and the GGUF tensor layout, not
from llama.cpp's graph. It recomputes the whole sequence every step (no KV cache): it is an
oracle, not a server. Weights are dequantized with `gguf.quants.dequantize` to float32.

Run it in its own process (`python -m swarm.reference`): torch and llama.cpp computing in one
process slow each other down (two OpenMP pools; shared NOTES).

This module does not support gemma3 (sliding-window layers, extra norms) yet; it says so.
"""

from __future__ import annotations

import argparse
import json
import mmap
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from swarm.arch import arch_row
from swarm.errors import UnsupportedArchitecture
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.gguf_raw import tensor_bytes


class ReferenceModel:
    """Blocks [start, end) of a llama-style GGUF in float32 torch.

    Args:
        path: the GGUF.
        start, end: global half-open block span; the head (output norm + lm_head) runs when end == n_layers.
    Raises:
        UnsupportedArchitecture: not a llama-style block (see `ArchRow.torch_reference`).
    """

    def __init__(self, path: Path, start: int = 0, end: int | None = None):
        # The project's header scan and raw tensor bytes, not gguf.GGUFReader: the reader parses every
        # tokenizer string into its own array (18 of 30 s for Qwen's 151,936-token vocabulary).
        header = scan(path)
        self.meta = header.scalars
        arch = self.meta["general.architecture"]
        row = arch_row(arch)
        if not row.torch_reference:
            raise UnsupportedArchitecture(f"the PyTorch reference does not implement architecture {arch!r}")
        self.rope_neox = row.rope_neox
        p = f"{arch}."
        self.n_layers = int(self.meta[p + "block_count"])
        self.start, self.end = start, self.n_layers if end is None else end
        self.n_head = int(self.meta[p + "attention.head_count"])
        self.n_head_kv = int(self.meta[p + "attention.head_count_kv"])
        self.eps = float(self.meta[p + "attention.layer_norm_rms_epsilon"])
        self.rope_base = float(self.meta.get(p + "rope.freq_base", 10000.0))
        with open(path, "rb") as f:  # an ndarray over the mapping, not np.memmap: no hook on every view
            data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        self.w = {
            name: torch.from_numpy(np.array(
                dequantize(tensor_bytes(data, t), GGMLQuantizationType(t.ggml_type)), dtype=np.float32))
            for name, t in header.tensors.items() if self._wanted(name)
        }
        self.n_embd = self.w["token_embd.weight"].shape[1]

    def _wanted(self, name: str) -> bool:
        if name.startswith("blk."):
            return self.start <= int(name.split(".")[1]) < self.end
        return True

    def forward(self, tokens: list[int]) -> torch.Tensor:
        """Logits `[n_tokens, n_vocab]` float32 for a whole token sequence (causal)."""
        x = self.w["token_embd.weight"][torch.tensor(tokens)]
        for layer in range(self.start, self.end):
            x = self._block(layer, x)
        x = _rms_norm(x, self.w["output_norm.weight"], self.eps)
        head = self.w.get("output.weight", self.w["token_embd.weight"])
        return x @ head.T

    def _block(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        w = lambda name: self.w[f"blk.{layer}.{name}"]  # noqa: E731
        b = lambda name: self.w.get(f"blk.{layer}.{name}.bias")  # noqa: E731
        n, d = x.shape
        hd = d // self.n_head
        h = _rms_norm(x, w("attn_norm.weight"), self.eps)
        q, k, v = (_linear(h, w(f"attn_{t}.weight"), b(f"attn_{t}")) for t in "qkv")
        q = self._rope(q.view(n, self.n_head, hd))
        k = self._rope(k.view(n, self.n_head_kv, hd))
        v = v.view(n, self.n_head_kv, hd)
        rep = self.n_head // self.n_head_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, d)
        x = x + attn @ w("attn_output.weight").T
        h = _rms_norm(x, w("ffn_norm.weight"), self.eps)
        mlp = torch.nn.functional.silu(h @ w("ffn_gate.weight").T) * (h @ w("ffn_up.weight").T)
        return x + mlp @ w("ffn_down.weight").T

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """Rotary position embedding (Su et al. 2021) over `[n, heads, head_dim]`.

        NEOX style rotates the two halves of each head; NORM style rotates adjacent pairs (the layout
        llama.cpp's converter gives llama q/k weights)."""
        n, _, hd = x.shape
        inv = self.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        if self.rope_neox:
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x @ weight.T
    return y if bias is None else y + bias


def greedy(model: ReferenceModel, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens after `prompt`, and the max logit of each step (for drift reports)."""
    tokens, maxima = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model.forward(tokens)[-1]
            tokens.append(int(logits.argmax()))
            maxima.append(float(logits.max()))
    return tokens[len(prompt) :], maxima


def teacher_forced(model: ReferenceModel, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Logits `[len(continuation), n_vocab]` predicting each continuation token from all before it."""
    with torch.no_grad():
        logits = model.forward(list(prompt) + list(continuation)[:-1])
    return logits[len(prompt) - 1:]


def main(argv: list[str] | None = None) -> int:
    """`python -m swarm.reference --model PATH --tokens 1,2,3 --steps 16`: prints {"tokens": [...]};
    with `--teacher 4,5,6` prints {"logits": [[...], ...]} predicting each teacher token instead."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--teacher", default="", help="comma-separated continuation: print the logits predicting it")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        model = ReferenceModel(Path(args.model))
    except UnsupportedArchitecture as e:
        print(f"swarm.reference: error: {e}", file=sys.stderr)
        return 1
    prompt = [int(t) for t in args.tokens.split(",")]
    if args.teacher:
        logits = teacher_forced(model, prompt, [int(t) for t in args.teacher.split(",")])
        json.dump({"logits": logits.tolist()}, sys.stdout)
        return 0
    tokens, maxima = greedy(model, prompt, args.steps)
    json.dump({"tokens": tokens, "max_logits": maxima}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
