#!/usr/bin/env python3
"""The peer of `ape-train --device cuda`: the same decoder in plain PyTorch, attention by
torch.nn.functional.scaled_dot_product_attention, RoPE (rotate-half pairs, the spec's) on q and k,
bf16 autocast with float32 weights, AdamW and gradient clipping as ape-train does them; random
tokens (tokens/s does not depend on the data). Prints the SDPA backend that ran, tokens/s over all
steps (as ape-train reports it) and after the first five, and the peak memory allocated.

  python3 bench/train_peer.py --d-model 1024 --layers 8 --heads 16 --seq-len 2048 --batch 8 --steps 40
  python3 bench/train_peer.py ... --backend cudnn      # SDPA's cuDNN backend, forced

--backend default is SDPA's own choice (by its priority order: FlashAttention-2 before cuDNN in
PyTorch 2.11 and 2.15, so not the fastest on Hopper); cudnn and flash force one (an error if it
cannot run). --rotary compiled (the default) rotates q and k by torch.compile(fullgraph=True), one
fused pass, as a user would; eager by torch ops (several passes).

The architecture is ape-train's (runtime/Model.cpp): pre-LayerNorm blocks, q/k/v without bias,
the output projection and the MLP (4d, GELU) with bias, a final LayerNorm, the output tied to the
token embedding. scripts/gpu-check.sh runs it beside ape-train in its train stage.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_tables(T, D, device, base=10000.0):
    """cos, sin (T, D) in bf16 for rotate-half pairs (c, c + D/2), angle n * base^(-2c/D): the
    pairing of examples/encodings/rope.mlir (pairing = "half")."""
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(device, torch.bfloat16), ang.sin().to(device, torch.bfloat16)


def rotate(x, cos, sin):  # x (B, H, T, D) bf16 under autocast
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}


class Block(nn.Module):
    def __init__(self, d, heads, layers, std, rot, backend):
        super().__init__()
        self.heads, self.rot, self.backend = heads, rot, backend
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.wq, self.wk, self.wv = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.wo = nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        for m in (self.wq, self.wk, self.wv, self.fc):
            nn.init.normal_(m.weight, 0.0, std)
        for m in (self.wo, self.proj):
            nn.init.normal_(m.weight, 0.0, std / math.sqrt(2 * layers))
            nn.init.zeros_(m.bias)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        H = self.heads
        y = self.ln1(x)
        q, k, v = (w(y).view(B, T, H, d // H).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = self.rot(q, cos, sin), self.rot(k, cos, sin)
        if self.backend is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel(self.backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, vocab, d, layers, heads, rot, backend, std=0.02):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        nn.init.normal_(self.wte.weight, 0.0, std)
        self.blocks = nn.ModuleList(Block(d, heads, layers, std, rot, backend) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens, cos, sin):
        x = self.wte(tokens)
        for b in self.blocks:
            x = b(x, cos, sin)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--backend", choices=["default"] + sorted(BACKENDS), default="default",
                   help="SDPA's backend: its own choice (default), or cudnn / flash forced")
    p.add_argument("--rotary", choices=["compiled", "eager"], default="compiled",
                   help="rotate q and k by torch.compile (default) or by eager torch ops")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_peer.py: no CUDA device")
    dev = torch.device("cuda")
    from torch.nn.attention import SDPBackend
    backend = getattr(SDPBackend, BACKENDS[a.backend]) if a.backend in BACKENDS else None
    rot = torch.compile(rotate, dynamic=False, fullgraph=True) if a.rotary == "compiled" else rotate
    torch.manual_seed(1234)
    model = Model(a.vocab, a.d_model, a.layers, a.heads, rot, backend).to(dev)
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and p.dim() >= 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    cos, sin = rope_tables(a.seq_len, a.d_model // a.heads, dev)
    tokens = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq_len + 1), device=dev)
    # The backend that runs: the forced one, or the one SDPA's own choice names for these shapes.
    hd = a.d_model // a.heads
    probe = torch.zeros(a.batch, a.heads, a.seq_len, hd, device=dev, dtype=torch.bfloat16)
    ran = a.backend if backend is not None else SDPBackend(torch._fused_sdp_choice(probe, probe, probe, is_causal=True)).name
    del probe
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    t5 = None
    losses = []
    for s in range(a.steps):
        if s == 5:
            torch.cuda.synchronize()
            t5 = time.perf_counter()
        w = tokens[s]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(w[:, :-1], cos, sin)
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    per_step = a.batch * a.seq_len
    params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated(dev) // (1 << 20)
    steady = (a.steps - 5) * per_step / (t1 - t5) if t5 else float("nan")
    print(f"PyTorch SDPA peer: {params} parameters; d {a.d_model}, {a.layers} layers, {a.heads} heads, "
          f"L {a.seq_len}, batch {a.batch}, bf16 autocast, {torch.cuda.get_device_name(dev)}; SDPA backend "
          f"{ran} ({'forced' if backend is not None else 'its own choice'}), rotary {a.rotary}")
    print(f"loss {losses[0].item():.4f} -> {losses[-1].item():.4f}")
    print(f"all steps: {a.steps * per_step / (t1 - t0):.0f} tok/s; after step 5: {steady:.0f} tok/s; "
          f"peak {peak} MiB allocated")


if __name__ == "__main__":
    main()
