"""A float64 PyTorch reference of the runtime's decoder language model (docs/internals.md, "The
model"), with materialised T x T causal attention and each encoding written from
docs/encodings-math.md: no APE code. It reads a checkpoint's tensors by their names.

`mutations` plants one deliberate error (MUTATIONS) so that the test shows it can fail."""
import math

import torch
import torch.nn.functional as F

F64 = torch.float64

# The errors the test plants, by the encoding whose part they change.
MUTATIONS = {"nope": ["ln_eps", "gelu_tanh"], "rope": ["rope_pairing"], "alibi": ["alibi_reversed"],
             "t5": ["t5_shift"], "cable": ["cable_sign", "scan_exclusive"], "fire": ["fire_no_l_mult"],
             "expe": ["expe_no_column"], "learned_absolute": ["wpe_shift"], "sinusoidal": ["sin_concat"],
             "forget_gate": ["scan_exclusive"], "xpos": ["xpos_no_scale"]}
# Planted in the runs with grouped keys (--kv-heads): the groups tiled (head h reads key head
# h mod H_kv) instead of consecutive (h // (H / H_kv)).
KV_MUTATIONS = ["kv_tiled"]


def alibi_slopes(heads):
    def powers(n):
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]
    if heads & (heads - 1) == 0:
        return torch.tensor(powers(heads), dtype=F64)
    c = 2 ** int(math.floor(math.log2(heads)))
    return torch.tensor(powers(c) + powers(2 * c)[0::2][:heads - c], dtype=F64)


def rotate(x, pos, pairing, base=10000.0):
    """x (B, H, T, D): pair k of each position n turned by n·θ_k, θ_k = base^(-2k/D)."""
    D = x.shape[-1]
    r = 2 * (D // 2)
    half = r // 2
    theta = torch.pow(torch.tensor(base, dtype=F64), -2 * torch.arange(half, dtype=F64) / r)
    angle = pos[:, None] * theta[None, :]
    c, s = torch.cos(angle), torch.sin(angle)
    out = x.clone()
    if pairing == "half":
        a, b = x[..., :half], x[..., half:r]
        out[..., :half], out[..., half:r] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2], out[..., 1:r:2] = a * c - b * s, b * c + a * s
    return out


class Reference:
    def __init__(self, encoding, config, tensors, mutations=()):
        m = config["model"]
        self.enc = encoding
        self.vocab, self.d, self.layers, self.heads = m["vocab"], m["d_model"], m["layers"], m["heads"]
        self.dh = self.d // self.heads
        self.kv_heads = m.get("kv_heads", self.heads)  # fewer: grouped-query attention
        self.w = {k: torch.as_tensor(v).to(F64) for k, v in tensors.items() if not k.startswith("train/")}
        self.mut = set(mutations)

    def ln(self, x, name):
        eps = 1e-6 if "ln_eps" in self.mut else 1e-5
        return F.layer_norm(x, (self.d,), self.w[name + ".weight"], self.w[name + ".bias"], eps)

    def linear(self, x, name, bias=True):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def embed(self, tok):  # site E
        x = self.w["wte.weight"][tok]
        T = tok.shape[1]
        if self.enc == "sinusoidal":
            angle = torch.arange(T, dtype=F64)[:, None] / torch.pow(
                torch.tensor(10000.0, dtype=F64), torch.arange(0, self.d, 2, dtype=F64) / self.d)
            if "sin_concat" in self.mut:
                pe = torch.cat([torch.sin(angle), torch.cos(angle)], -1)
            else:
                pe = torch.zeros(T, self.d, dtype=F64)
                pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)[:, :self.d // 2]
            x = x + pe
        elif self.enc == "learned_absolute":
            x = x + self.w["wpe"][1:T + 1] if "wpe_shift" in self.mut else x + self.w["wpe"][:T]
        return x

    def xpos_scale(self, T, sign, gamma=0.4, scale_base=512.0):
        half = self.dh // 2
        zeta = ((torch.arange(half, dtype=F64) / half + gamma) / (1 + gamma)).repeat_interleave(2)
        t = torch.arange(T, dtype=F64) - T // 2  # centred: the factors cancel in q·k all the same
        if "xpos_no_scale" in self.mut:
            return torch.ones(T, self.dh, dtype=F64)
        return torch.pow(zeta[None, :], sign * t[:, None] / scale_base)

    def bias(self, layer, xn, T):  # site S: (H, T, T) or (B, H, T, T), or None
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        dist = (i - j).clamp(min=0)
        pre = f"block{layer}.attn"
        if self.enc == "alibi":
            slopes = alibi_slopes(self.heads)
            stored = self.w[pre + ".alibi_slopes"].reshape(-1)
            assert torch.allclose(stored, slopes, rtol=1e-7, atol=0), (stored, slopes)
            if "alibi_reversed" in self.mut:
                slopes = slopes.flip(0)
            return -slopes[:, None, None] * dist[None].to(F64)
        if self.enc == "t5":  # 32 buckets, max distance 128, causal
            n = dist + (1 if "t5_shift" in self.mut else 0)
            far = 16 + torch.floor(torch.log(n.to(F64).clamp(min=1) / 16) / math.log(8) * 16).long()
            bucket = torch.where(n < 16, n, far.clamp(max=31))
            return self.w["shared_t5_table"][bucket].permute(2, 0, 1)
        if self.enc in ("cable", "forget_gate"):
            f = self.linear(xn, pre + ".wf")  # (B, T, H)
            b = -F.softplus(f) if self.enc == "cable" else F.logsigmoid(f)
            S = torch.cumsum(b, dim=1).permute(0, 2, 1)
            if "scan_exclusive" in self.mut:
                S = S - b.permute(0, 2, 1)
            if "cable_sign" in self.mut:
                S = -S
            return S[:, :, :, None] - S[:, :, None, :]
        if self.enc == "fire":
            c, l_mult = self.w[pre + ".fire_c"][0], self.w[pre + ".fire_l_mult"][0]
            psi = lambda x: torch.log(torch.abs(c * x) + 1)
            limit = 512.0 * (1.0 if "fire_no_l_mult" in self.mut else l_mult)
            x = psi(dist.to(F64)) / (psi(torch.clamp(i.to(F64), min=limit).expand(T, T)) + 1e-6)
            hidden = torch.relu(x[..., None] * self.w[pre + ".fire_w1"] + self.w[pre + ".fire_b1"])
            return (hidden @ self.w[pre + ".fire_w2"] + self.w[pre + ".fire_b2"]).permute(2, 0, 1)
        return None

    def attention(self, layer, xn):
        B, T, _ = xn.shape
        pre = f"block{layer}.attn"
        x_qk = xn
        if self.enc == "expe":  # the first l = 16 inputs of W_q, W_k replaced by σ·θ·(n + c)
            l, theta = 16, 1 / 2048
            n = torch.arange(T, dtype=F64)[:, None]
            if "expe_no_column" not in self.mut:
                n = n + torch.arange(l, dtype=F64)[None, :]
            sigma = self.w[pre + ".position_scale"].reshape(()) if pre + ".position_scale" in self.w else 1.0
            x_qk = torch.cat([(sigma * theta * n)[None].expand(B, T, l), xn[..., l:]], dim=-1)
        heads = lambda z, n: z.view(B, T, n, self.dh).transpose(1, 2)
        q = heads(self.linear(x_qk, pre + ".wq", False), self.heads)
        k = heads(self.linear(x_qk, pre + ".wk", False), self.kv_heads)
        v = heads(self.linear(xn, pre + ".wv", False), self.kv_heads)
        if self.kv_heads != self.heads:  # query head h reads key head h // (H / H_kv)
            g = self.heads // self.kv_heads
            k, v = ((z.repeat(1, g, 1, 1) if "kv_tiled" in self.mut else z.repeat_interleave(g, 1)) for z in (k, v))
        pos = torch.arange(T, dtype=F64)
        if self.enc == "rope":
            pairing = "interleaved" if "rope_pairing" in self.mut else "half"
            q, k = rotate(q, pos, pairing), rotate(k, pos, pairing)
        elif self.enc == "xpos":
            q = rotate(q, pos, "interleaved") * self.xpos_scale(T, +1)
            k = rotate(k, pos, "interleaved") * self.xpos_scale(T, -1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        b = self.bias(layer, xn, T)
        if b is not None:
            s = s + b
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, self.d)
        return self.linear(o, pre + ".wo")

    def token_losses(self, windows):
        """windows (N, T + 1): the cross-entropy of each target, (N, T)."""
        tok, target = windows[:, :-1], windows[:, 1:]
        x = self.embed(tok)
        for layer in range(self.layers):
            x = x + self.attention(layer, self.ln(x, f"block{layer}.ln1"))
            h = F.gelu(self.linear(self.ln(x, f"block{layer}.ln2"), f"block{layer}.fc"),
                       approximate="tanh" if "gelu_tanh" in self.mut else "none")
            x = x + self.linear(h, f"block{layer}.proj")
        logits = self.ln(x, "ln_f") @ self.w["wte.weight"].T  # the head is the token embedding
        return F.cross_entropy(logits.reshape(-1, self.vocab), target.reshape(-1),
                               reduction="none").view(target.shape)
