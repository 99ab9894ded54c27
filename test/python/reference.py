"""Materialised references for the framework-interop tests, written from the math of the
encodings (docs/encodings-math.md, docs/internals.md), never from the generated kernels.

    l_ij = scale * q'_i . k'_j + B_ij     (j <= i; -inf above the diagonal)
    o_i  = sum_j softmax_j(l_ij) v_j      (every (B, H, T, T) matrix materialised)

    nope   nothing but the causal mask
    rope   q'_n = R(n) q_n, k' likewise: rotate-half pairs (c, c + d_r/2), angle n * 1e4^(-2c/d_r), d_r = 2 floor(D/2)
    alibi  B_ij = -m_h (i - j), m = param "alibi_slopes" [H] (alibi_learned: the same, trained)
    rope_alibi  both
    cable  S_t = sum_{u<=t} -softplus(f_u), B_ij = S_i - S_j           (feature 0, [B, H, T])
    expe   q'_n = q_n + s (a_q + n b_q), k'_n = k_n + s (a_k + n b_k)     (params [H, D]; s = param
           "position_scale" when the kernel has one, else 1)

expe_through_projection() is the literal ExPE / ExQPE: the first l inputs of the q/k projections
are overwritten by positions (ExPE p_{n,i} = start + theta (n + i); ExQPE p_{n,j} = start +
j theta1 + theta2 c_j(n), c_j(n) = floor(n/l) + [j <= n mod l]) and projected, no additive form.
"""
import math

import torch

# The encodings attention() knows: deliberately a subset, one of each kind (none, a rotation, a
# bias with fixed or trainable slopes, a token feature, an override), written from the spec, for
# the checks that need the reference in the input's own dtype or on its device. Every encoding's
# library is checked against the independent C++ reference of ape_kernels_test as well
# (support.kernel_reference, test_torch_ops.py).
ENCODINGS = ["nope", "rope", "alibi", "alibi_learned", "rope_alibi", "cable", "expe"]


def rope(x, base=1e4):
    """Rotate-half RoPE of x (..., T, D), position n = index along dim -2."""
    T, D = x.shape[-2], x.shape[-1]
    half = D // 2  # d_r = 2 half rotated coordinates: an odd D's last one is left as it is
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / (2 * half))
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None, :]  # (T, D/2)
    cos, sin = torch.cos(angle).to(x), torch.sin(angle).to(x)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half:]], dim=-1)


def alibi_slopes(heads):
    def pow2(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    if heads & (heads - 1) == 0:
        return pow2(heads)
    c = 1 << (heads.bit_length() - 1)
    return pow2(c) + pow2(2 * c)[0::2][: heads - c]


def causal_attention(q, k, v, scale, bias=None):
    """softmax(scale q k^T + bias, causal) v with the (.., T, T) logits materialised."""
    T = q.shape[-2]
    logits = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        logits = logits + bias
    i = torch.arange(T, device=q.device)
    logits = logits.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def attention(encoding, q, k, v, features=(), params=None, scale=None):
    """The reference o (B, H, T, D); differentiable in every argument."""
    params = params or {}
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    bias = None
    n = torch.arange(T, dtype=q.dtype, device=q.device)
    if encoding not in ENCODINGS:
        raise ValueError(f"no reference for encoding {encoding!r}")
    if encoding in ("rope", "rope_alibi"):
        q, k = rope(q), rope(k)
    if encoding in ("alibi", "alibi_learned", "rope_alibi"):
        m = params["alibi_slopes"].view(H, 1, 1)
        bias = -m * (n[:, None] - n[None, :])
    if encoding == "cable":
        s = torch.cumsum(-torch.nn.functional.softplus(features[0]), dim=-1)  # (B, H, T)
        bias = s[..., :, None] - s[..., None, :]
    if encoding == "expe":
        sigma = params["position_scale"].reshape(()) if "position_scale" in params else 1.0
        for side in ("q", "k"):
            a = params[f"override_{side}_a"].view(1, H, 1, D)
            b = params[f"override_{side}_b"].view(1, H, 1, D)
            term = sigma * (a + n.view(1, 1, T, 1) * b)
            if side == "q":
                q = q + term
            else:
                k = k + term
    return causal_attention(q, k, v, scale, bias)


def expe_positions(override, T, dtype, sigma=1.0):
    """The override's positions (T, l) times sigma: ExPE p_{n,i} = start + theta (n + i); ExQPE
    p_{n,j} = start + j theta1 + theta2 c_j(n), c_j(n) = floor(n/l) + [j <= n mod l]."""
    l = int(override["l"])
    n = torch.arange(T, dtype=torch.float64)[:, None]
    i = torch.arange(l, dtype=torch.float64)[None, :]
    if override["kind"] == "exqpe":
        count = torch.div(n, l, rounding_mode="floor") + (i <= torch.remainder(n, l)).double()
        p = override["start"] + i * override["theta1"] + override["theta2"] * count
    else:
        p = override["start"] + override["theta"] * (n + i)
    return (sigma * p).to(dtype)


def expe_through_projection(x, wq, wk, wv, heads, override, sigma=1.0):
    """Literal ExPE on x (B, T, d): x[..., :l] replaced by the positions for the q and k
    projections (x itself for v), then plain causal attention. Returns (B, H, T, D)."""
    B, T, d = x.shape
    D = d // heads
    l = int(override["l"])
    pos = expe_positions(override, T, x.dtype, sigma).to(x.device).expand(B, T, l)
    xo = torch.cat([pos, x[..., l:]], dim=-1)

    def split(t):  # (B, T, d) -> (B, H, T, D)
        return t.view(B, T, heads, D).transpose(1, 2)

    q = split(xo @ wq.t() if "q" in override["targets"] else x @ wq.t())
    k = split(xo @ wk.t() if "k" in override["targets"] else x @ wk.t())
    v = split(xo @ wv.t() if "v" in override["targets"] else x @ wv.t())
    return causal_attention(q, k, v, 1.0 / math.sqrt(D))
