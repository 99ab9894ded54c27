"""The operator library of an inference-only encoding (an ape.attention_transition: rope_transition)
against a materialised reference written here from docs/encodings-math.md ("Attention transition
(P)": RoPE's softmax weights, the spec's five steps applied to each transformed row, then A V), at
every layer of models of 6 and 8 layers; the untransformed layers against rope's own library; the
keyword arguments layer= and num_layers=, the refusal of gradients, of the raw backward and of
layers out of range, with clear messages; no_grad, inference_mode, meta tensors and torch.compile."""
import json

import pytest
import torch

import reference
from support import DEVICES, TRANSITION_ENCODINGS, close, helper, ops

pytestmark = pytest.mark.skipif(not TRANSITION_ENCODINGS, reason="no inference-only example encoding in this build")


def transition_reference(q, k, v, layer, num_layers, t):
    """RoPE attention with the spec's transition `t` (the manifest's "transition") at `layer` of
    `num_layers`, float64, the softmax weights materialised and changed row by row."""
    B, H, T, D = q.shape
    qr, kr = reference.rope(q), reference.rope(k)
    logits = (qr @ kr.transpose(-1, -2)) / D ** 0.5
    i = torch.arange(T)
    A = torch.softmax(logits.masked_fill(i[None, :] > i[:, None], float("-inf")), dim=-1)
    N, first, skip = num_layers, t["first_layer"], t["skip_last"]
    if N <= 0 or layer < first or layer > N - 1 - skip:
        return A @ v
    unit = T // (N + t["divisor_offset"])
    width = unit - unit % 5
    if width < 5:
        return A @ v
    alpha, beta = t["alpha"], t["beta"]
    keys = torch.arange(T)
    A = A.clone()
    c = lambda x: torch.tensor(x, dtype=torch.float64)  # (torch.where of two Python floats is float32)
    for m in range(t["intervals"]):
        s = (layer + 1 + m) * width
        e = s + width
        bound = alpha / e                                                    # 1.
        window = (keys >= s - 2 * width) & (keys < s)
        share = torch.where(keys >= s - width, c(7.0), c(3.0))
        for r in range(s, min(e, T)):
            a = torch.where((A[..., r, :] < bound) & (keys < e), c(0.0), A[..., r, :])  # 2.
            a = a * torch.where(keys == 0, c(0.5), c(1.0))
            E = 1.0 - a.sum(-1, keepdim=True)                                # 3.
            mask = torch.where(window, torch.where(a >= bound, c(1.0), c(0.01)), c(0.0))  # 4.
            avg = beta * E / mask.sum(-1, keepdim=True)
            A[..., r, :] = a + share * avg * mask                            # 5.
    return A @ v


def test_hand_row_of_the_spec():
    """The reference above on the spec's own hand-checked row (docs/encodings-math.md): row 5,
    interval (4, 6), I = 2."""
    A = torch.tensor([0.30, 0.02, 0.08, 0.10, 0.20, 0.30], dtype=torch.float64)
    s, e, width, alpha, beta = 4, 6, 2, 0.5, 0.1
    keys = torch.arange(6)
    c = lambda x: torch.tensor(x, dtype=torch.float64)
    a = torch.where((A < alpha / e) & (keys < e), c(0.0), A) * torch.where(keys == 0, c(0.5), c(1.0))
    E = 1.0 - a.sum()
    mask = torch.where((keys >= s - 2 * width) & (keys < s), torch.where(a >= alpha / e, c(1.0), c(0.01)), c(0.0))
    out = a + torch.where(keys >= s - width, c(7.0), c(3.0)) * beta * E / mask.sum() * mask
    want = torch.tensor([0.187129, 0.000371, 0.000866, 0.186634, 0.2, 0.3], dtype=torch.float64)
    assert torch.allclose(out, want, atol=1e-6), out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("encoding", TRANSITION_ENCODINGS)
def test_every_layer_matches_the_reference(encoding, device):
    h = helper(encoding)
    schema = ops(encoding).attention.default._schema
    assert h.INFERENCE_ONLY and [a.name for a in schema.arguments if a.kwarg_only] == ["layer", "num_layers"]
    t = h.MANIFEST["transition"]
    torch.manual_seed(5)
    transformed = 0
    for (B, H, T, D), N in [((2, 3, 150, 16), 6), ((1, 2, 203, 64), 8)]:
        q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
        for layer in range(N):
            want = transition_reference(q, k, v, layer, N, t)
            plain = transition_reference(q, k, v, 0, 0, t)
            transformed += int(not torch.equal(want, plain))
            with torch.no_grad():
                got = h.attention(q.to(device), k.to(device), v.to(device), layer=layer, num_layers=N)
            close(got.cpu(), want, f"{encoding} o at layer {layer} of {N}, T {T}", atol=1e-12)
            # float32: within its rounding
            with torch.no_grad():
                got32 = h.attention(q.float().to(device), k.float().to(device), v.float().to(device),
                                    layer=layer, num_layers=N)
            close(got32.cpu().double(), want, f"{encoding} float32 o at layer {layer} of {N}", atol=2e-5)
    assert transformed >= 6, "the reference transformed too few layers for the check to mean anything"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("encoding", TRANSITION_ENCODINGS)
def test_grouped_queries(encoding, device):
    """k and v of 2 and 1 key/value heads for 4 query heads (grouped-query attention): every
    layer against the reference over k and v repeated to the query heads."""
    h, t = helper(encoding), helper(encoding).MANIFEST["transition"]
    torch.manual_seed(7)
    B, H, T, D, N = 1, 4, 150, 16, 6
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    for kv in (2, 1):
        k, v = (torch.randn(B, kv, T, D, dtype=torch.float64) for _ in range(2))
        kr, vr = (x.repeat_interleave(H // kv, 1) for x in (k, v))
        for layer in range(N):
            want = transition_reference(q, kr, vr, layer, N, t)
            with torch.no_grad():
                got = h.attention(q.to(device), k.to(device), v.to(device), layer=layer, num_layers=N)
            close(got.cpu(), want, f"{encoding} o at layer {layer} of {N}, {kv} key heads", atol=1e-12)


@pytest.mark.parametrize("encoding", TRANSITION_ENCODINGS)
def test_untransformed_layers_equal_rope(encoding):
    """Layers the transition leaves alone (0, the last two, num_layers 0, a prompt too short) are
    the plain RoPE attention of rope's own library, bit for bit."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 2, 120, 32) for _ in range(3))
    with torch.inference_mode():
        want = ops("rope").attention(q, k, v)
        for layer, N in [(0, 6), (4, 6), (5, 6), (0, 0), (2, 40)]:
            got = ops(encoding).attention(q, k, v, layer=layer, num_layers=N)
            assert torch.equal(got, want), (layer, N)
        moved = ops(encoding).attention(q, k, v, layer=2, num_layers=6)
    assert not torch.equal(moved, want), "layer 2 of 6 at T 120 should be transformed"


@pytest.mark.parametrize("encoding", TRANSITION_ENCODINGS)
def test_gradients_and_bad_layers_are_refused(encoding):
    h, o = helper(encoding), ops(encoding)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    with pytest.raises(RuntimeError, match=r"inference-only.*torch\.no_grad\(\)"):
        o.attention(q, k, v, layer=1, num_layers=6)
    with torch.no_grad():  # the same inputs without recording: fine
        assert o.attention(q, k, v, layer=1, num_layers=6).shape == q.shape
    with pytest.raises(RuntimeError, match="inference-only"):
        o.attention_backward(q.detach(), q.detach(), k.detach(), v.detach(), q.detach(),
                             torch.zeros(1, 2, 40), [], [], 0.25)
    x = q.detach()
    # Forward mode: a dual tensor's tangent would be dropped (a zero derivative): refused too.
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        with pytest.raises(RuntimeError, match="forward-mode tangent"):
            o.attention(fwad.make_dual(x, torch.ones_like(x)), x, x, layer=1, num_layers=6)
    with pytest.raises(RuntimeError, match="forward-mode tangent"):
        torch.func.jvp(lambda a: o.attention(a, x, x, layer=1, num_layers=6), (x,), (torch.ones_like(x),))
    with pytest.raises(ValueError, match=rf"ape_{encoding}\.attention: layer must be in \[0, num_layers\) = \[0, 6\)"):
        o.attention(x, x, x, layer=6, num_layers=6)
    with pytest.raises(ValueError, match=r"layer must be in"):
        o.attention(x, x, x, layer=-1, num_layers=6)
    with pytest.raises(ValueError, match=r"num_layers must be in \[0, 100000\]"):
        o.attention(x, x, x, layer=0, num_layers=-2)
    with pytest.raises(RuntimeError, match="num_layers"):  # the schema asks for both, by keyword
        o.attention(x, x, x)
    with pytest.raises(ValueError, match="needs layer= and num_layers="):
        h.attention(x, x, x)
    with pytest.raises(ValueError, match="for an attention transition"):
        helper("rope").attention(x, x, x, layer=1, num_layers=6)


@pytest.mark.parametrize("encoding", TRANSITION_ENCODINGS)
def test_raw_forward_meta_and_compile(encoding):
    o = ops(encoding)
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 90, 16) for _ in range(3))
    with torch.no_grad():
        want = o.attention(q, k, v, layer=1, num_layers=4)
    out, lse = o.attention_forward(q, k, v, [], [], 0.25, 1, 4)
    assert torch.equal(out, want) and lse.shape == (1, 2, 90)
    m_out, m_lse = o.attention_forward(q.to("meta"), k.to("meta"), v.to("meta"), [], [], 0.25, 1, 4)
    assert m_out.shape == q.shape and m_out.device.type == "meta" and m_lse.shape == (1, 2, 90)
    fn = torch.compile(lambda a, b, c: o.attention(a, b, c, layer=1, num_layers=4), fullgraph=True,
                       backend="eager")
    with torch.no_grad():
        assert torch.equal(fn(q, k, v), want)
    assert json.loads(o.manifest())["inference_only"] is True
