#!/usr/bin/env python3
"""Cable attention from APE inside a plain PyTorch model (docs/frameworks.md).

1. compiles examples/encodings/cable.mlir with `apec --emit=torch-library` and builds the
   operator library with CMake (skip both with --library-dir),
2. loads torch.ops.ape_cable into a one-block decoder written in plain PyTorch, the Cable token
   feature computed by the model as the manifest says (a Linear of the normalised input),
3. trains it a few steps on a toy next-token task,
4. checks the fused operator against PyTorch's own materialised Cable attention: the loss and
   every parameter gradient of the model, in float64.

    .venv/bin/python examples/python/cable_in_pytorch.py --apec build/tools/apec --work /tmp/ape-py
"""
import argparse
import importlib.util
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_library(apec, work):
    """apec --emit=torch-library, then CMake; returns the build folder."""
    spec = os.path.join(ROOT, "examples", "encodings", "cable.mlir")
    subprocess.run([apec, spec, "-o", work, "--emit=torch-library"], check=True)
    src, build = os.path.join(work, "cable_torch_library"), os.path.join(work, "cable_torch_library", "build")
    subprocess.run(["cmake", "-S", src, "-B", build, f"-DAPE_PYTHON={sys.executable}"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 1)], check=True)
    return build


def import_helper(folder):
    """The generated ape_cable.py of a built folder, its library loaded."""
    spec = importlib.util.spec_from_file_location("ape_cable", os.path.join(folder, "ape_cable.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.load()
    return module


def materialised_cable(q, k, v, f):
    """PyTorch's own Cable attention: softmax(q k^T / sqrt(D) + S_i - S_j, causal) v with
    S = cumsum(-softplus(f)); every (T, T) logit matrix materialised."""
    T, D = q.shape[-2:]
    s = torch.cumsum(-F.softplus(f), dim=-1)
    logits = q @ k.transpose(-1, -2) / D ** 0.5 + s[..., :, None] - s[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1) @ v


class Decoder(nn.Module):
    """Embedding, one pre-norm attention + MLP block, tied output."""

    def __init__(self, ape, vocab=16, d=32, heads=4):
        super().__init__()
        self.ape, self.heads = ape, heads
        self.wte = nn.Embedding(vocab, d)
        nn.init.normal_(self.wte.weight, std=0.1)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        # One Linear(d, H) per token feature of the manifest, initialised as it says.
        self.features = nn.ModuleList()
        for spec in ape.MANIFEST["features"]:
            lin = nn.Linear(d, heads)
            nn.init.normal_(lin.weight, std=spec["weight_std"])
            nn.init.constant_(lin.bias, spec["bias"])
            self.features.append(lin)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, tokens, fused=True):
        x = self.wte(tokens)
        B, T, d = x.shape
        h = self.ln1(x)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        feats = [lin(h).transpose(1, 2) for lin in self.features]  # each (B, H, T)
        if fused:
            o = self.ape.load().attention(q, k, v, *feats)
        else:
            o = materialised_cable(q, k, v, *feats)
        x = x + self.proj(o.transpose(1, 2).reshape(B, T, d))
        x = x + self.mlp(self.ln2(x))
        return self.ln_f(x) @ self.wte.weight.t()


def batch(generator, B=16, T=24, vocab=16):
    """Counting sequences from random starts with random strides: next = (token + stride) % vocab."""
    start = torch.randint(vocab, (B, 1), generator=generator)
    stride = torch.randint(1, 4, (B, 1), generator=generator)
    seq = (start + stride * torch.arange(T + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apec", default=os.path.join(ROOT, "build", "tools", "apec"))
    ap.add_argument("--work", default="/tmp/ape-python-example", help="where apec and CMake write")
    ap.add_argument("--library-dir", help="an already built cable_torch_library build folder")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()

    folder = args.library_dir or build_library(args.apec, args.work)
    ape = import_helper(folder)
    torch.manual_seed(0)
    model = Decoder(ape)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        x, y = batch(g)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0 or step == args.steps - 1:
            print(f"step {step:3d}: loss {loss.item():.4f}")

    # The check: the same model, fused operator vs materialised attention, in float64.
    model = model.double()
    x, y = batch(g)
    results = []
    for fused in (True, False):
        model.zero_grad()
        loss = F.cross_entropy(model(x, fused=fused).flatten(0, 1), y.flatten())
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (l_fused, g_fused), (l_ref, g_ref) = results
    grad_err = max((a - b).abs().max().item() / max(1.0, b.abs().max().item()) for a, b in zip(g_fused, g_ref))
    ok = abs(l_fused - l_ref) < 1e-10 and grad_err < 1e-9
    print(f"fused vs materialised (float64): |loss diff| {abs(l_fused - l_ref):.1e}, "
          f"max relative gradient diff {grad_err:.1e}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
