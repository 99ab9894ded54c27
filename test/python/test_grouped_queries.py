"""Grouped-query attention through torch.ops.ape_<enc>: k and v of H_kv heads, each shared by
H / H_kv query heads (H_kv = 1: multi-query), as scaled_dot_product_attention(enable_gqa=True)
groups them. Every example encoding in float64 against the independent C++ reference over k and
v repeated to H heads (its dk and dv summed over each group); NoPE against PyTorch's own
enable_gqa attention; the bfloat16 path (the CPU kernel reads bf16 rows of the key heads in
place); derived params from a grouped W_k; opcheck (the Meta kernels' dk and dv shapes) and the
refusals."""
import pytest
import torch

from support import DEVICES, ENCODINGS, close, helper, kernel_reference, make_inputs, ops, ordered


def call(encoding, q, k, v, features, params, scale=None):
    return ops(encoding).attention(q, k, v, *features, *ordered(encoding, params), scale=scale)


def grouped(k, v, kv):
    """The first kv heads of k and v, as new leaves."""
    return [t.detach()[:, :kv].clone().requires_grad_() for t in (k, v)]


def group_sum(g, kv):
    B, H, T, D = g.shape
    return g.reshape(B, kv, H // kv, T, D).sum(2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_grouped_queries_match_the_kernel_reference(encoding, device):
    B, H, T, D = 2, 4, 37, 8
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, torch.float64, device, seed=5)
    dout = torch.randn(B, H, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    trainable = [p for p in params.values() if p.requires_grad]
    for kv in (2, 1):
        kg, vg = grouped(k, v, kv)
        xs = [q, kg, vg, *features, *trainable]
        o = call(encoding, q, kg, vg, features, params)
        grads = torch.autograd.grad(o, xs, dout)
        assert grads[1].shape == kg.shape and grads[2].shape == vg.shape
        want = kernel_reference(encoding, q, kg.repeat_interleave(H // kv, 1), vg.repeat_interleave(H // kv, 1),
                                features, params, dout)
        want[2], want[3] = group_sum(want[2], kv), group_sum(want[3], kv)
        names = ["o", "dq", "dk", "dv"] + [f"d{n}" for n in helper(encoding).FEATURES] + \
            [f"d{n}" for n, p in params.items() if p.requires_grad]
        for name, g, w in zip(names, [o, *grads], want):
            assert g.device.type == device, name
            close(g, w, f"{name} (kv heads {kv})", atol=1e-9 * max(1.0, w.abs().max().item()), rtol=1e-8)


@pytest.mark.parametrize("device", DEVICES)
def test_nope_matches_pytorch_enable_gqa(device):
    """NoPE is plain causal attention: scaled_dot_product_attention(enable_gqa=True) is a peer."""
    B, H, T, D = 2, 6, 45, 16
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, T, D, dtype=torch.float64, generator=g).to(device).requires_grad_()
    dout = torch.randn(B, H, T, D, dtype=torch.float64, generator=g).to(device)
    for kv in (3, 2, 1):
        k = torch.randn(B, kv, T, D, dtype=torch.float64, generator=g).to(device).requires_grad_()
        v = torch.randn(B, kv, T, D, dtype=torch.float64, generator=g).to(device).requires_grad_()
        o = ops("nope").attention(q, k, v)
        o_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        close(o, o_ref, f"o (kv heads {kv})", atol=1e-12, rtol=1e-11)
        for name, a, b in zip(["dq", "dk", "dv"], torch.autograd.grad(o, [q, k, v], dout),
                              torch.autograd.grad(o_ref, [q, k, v], dout)):
            close(a, b, f"{name} (kv heads {kv})", atol=1e-11, rtol=1e-10)


@pytest.mark.parametrize("encoding", ["rope", "cable", "alibi"])
def test_bfloat16_grouped_rows(encoding):
    """bf16 on the CPU (the kernel reads bf16 rows of each key head in place, AttnArgs::bf16_io):
    o and dq equal the call on k and v repeated to H heads bit for bit (the same rows, the same
    arithmetic); dk and dv equal its gradients summed over each group to bf16's roundings: here
    the group's float32 sum is rounded once, there each term was (unit roundoff u = 2^-8 each:
    |here - there| <= u |sum| + u sum |terms|)."""
    B, H, T, D = 1, 4, 70, 16
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, torch.bfloat16, seed=9)
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(3)).bfloat16()
    kg, vg = grouped(k, v, 2)
    o = call(encoding, q, kg, vg, features, params)
    dq, dk, dv = torch.autograd.grad(o, [q, kg, vg], dout)
    kr, vr = (t.detach().repeat_interleave(2, 1).requires_grad_() for t in (kg, vg))
    o_rep = call(encoding, q, kr, vr, features, params)
    dq_rep, dk_rep, dv_rep = torch.autograd.grad(o_rep, [q, kr, vr], dout)
    assert torch.equal(o, o_rep) and torch.equal(dq, dq_rep)
    for name, a, b in [("dk", dk, dk_rep), ("dv", dv, dv_rep)]:
        want = group_sum(b.double(), 2)
        bound = 2 ** -8 * (want.abs() + group_sum(b.double().abs(), 2)) * 1.001
        excess = ((a.double() - want).abs() - bound).max().item()
        assert excess <= 0, f"{name}: beyond the two roundings' bound by {excess:.3e}"


def test_derived_params_from_grouped_projections():
    """ExPE's params from a W_k of kv_heads * head_dim rows: those of W_k with each key head's rows
    repeated for the query heads of its group, and the gradient reaches the grouped W_k."""
    h = helper("expe")
    H, D, kv, d = 4, 8, 2, 40
    g = torch.Generator().manual_seed(4)
    wq = torch.randn(H * D, d, dtype=torch.float64, generator=g)
    wk = torch.randn(kv * D, d, dtype=torch.float64, generator=g).requires_grad_()
    wk_full = wk.detach().view(kv, D, d).repeat_interleave(H // kv, 0).reshape(H * D, d)
    got = h.derived_params({"q": wq, "k": wk, "v": wq}, H, D)
    want = h.derived_params({"q": wq, "k": wk_full, "v": wq}, H, D)
    assert list(got) == list(want)
    for n in got:
        close(got[n], want[n], n, atol=1e-12)
    sum(t.sum() for t in got.values()).backward()
    assert wk.grad is not None and wk.grad.shape == wk.shape
    with pytest.raises(ValueError, match=r"w_q must have shape \[heads\*head_dim, d\]"):
        h.derived_params({"q": wq[: kv * D], "k": wk, "v": wq}, H, D)  # q's projection is per query head
    with pytest.raises(ValueError, match=r"or \[kv_heads\*head_dim, d\], kv_heads dividing heads"):
        h.derived_params({"q": wq, "k": torch.randn(3 * D, d, dtype=torch.float64), "v": wq}, H, D)


@pytest.mark.parametrize("encoding", ["nope", "t5", "cable"])
def test_opcheck_grouped(encoding):
    """Schema, autograd registration, fake tensors (dk, dv shaped like k, v) and AOT dispatch."""
    B, H, T, D = 2, 4, 9, 8
    q, k, v, features, params = make_inputs(encoding, B, H, T, D)
    kg, vg = grouped(k, v, 2)
    plist = ordered(encoding, params)
    o = ops(encoding)
    result = torch.library.opcheck(o.attention.default, (q, kg, vg, *features, *plist), raise_exception=False)
    assert all(r == "SUCCESS" for r in result.values()), result
    out, lse = o.attention_forward(q, kg, vg, features, plist, 0.25)
    result = torch.library.opcheck(o.attention_backward.default,
                                   (torch.randn_like(out), q, kg, vg, out.detach(), lse, features, plist, 0.25),
                                   raise_exception=False)
    assert all(r == "SUCCESS" for r in result.values()), result


def test_grouping_refusals():
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64)
    for kv, why in [(3, r"k has 3 heads and q 4: grouped-query attention needs q's heads to be a multiple of k's"),
                    (8, r"k has 8 heads and q 4")]:
        k = torch.randn(1, kv, 5, 8, dtype=torch.float64)
        with pytest.raises(ValueError, match=why):
            ops("nope").attention(q, k, k)
    with pytest.raises(ValueError, match=r"k has 2 heads and q 0"):  # (0 is a multiple of 2, but no group)
        k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
        ops("nope").attention(torch.randn(1, 0, 5, 8, dtype=torch.float64), k, k)
    k2 = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"v must have shape \[B, H_kv, T, D\] \(k's shape\)"):
        ops("nope").attention(q, k2, torch.randn(1, 1, 5, 8, dtype=torch.float64))
