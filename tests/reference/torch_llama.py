"""A plain-PyTorch LLaMA and a safetensors reader, written from the published
descriptions (Hugging Face's modeling_llama, the safetensors format), not from
our code: the reference side of tests/reference/check_llama.py,
check_hf_checkpoint.py, check_generate.py and bench/hf_check.py.

Needs numpy and torch; the scripts that import it first try them and exit 77
(CTest: skipped) without them.
"""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# --- the model, written out as in Hugging Face modeling_llama ------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(seq_len, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    t = torch.arange(seq_len).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.h, self.kv, self.hd, self.theta = h, kv, d // h, c["rope_theta"]
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)   # [B, H, T, hd]
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        cos, sin = rope_tables(t, self.hd, self.theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv  # query head i uses KV head i // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        out = (p @ v).transpose(1, 2).reshape(b, t, self.h * self.hd)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tied = c["tie_word_embeddings"]
        self.model = LlamaModel(c)
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, tokens):
        h = self.model(tokens)
        if self.tied:
            return F.linear(h, self.model.embed_tokens.weight)
        return self.lm_head(h)


# --- safetensors, read from the published format ------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "BF16":  # the upper half of an F32
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "I32":
            arr = np.frombuffer(raw, dtype="<i4")
        else:
            raise ValueError(f"{path}: unexpected dtype {t['dtype']} for {name}")
        tensors[name] = torch.from_numpy(arr.reshape(t["shape"]).copy())
    return meta, tensors
