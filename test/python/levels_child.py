"""Run by test_cpu_levels.py in a fresh process, since a library chooses its instruction-set
level once per process (APE_CPU_LEVEL in this process's environment, docs/frameworks.md):

    python levels_child.py ENCODING...

Prints one JSON object: the level that the operator library and the C ABI library of the first
encoding report, the status and message of one C ABI forward call of it, and per encoding the
operator's fp32 forward + backward errors against the fp64 materialised reference next to
PyTorch's own fp32 errors (or the message of the exception that the operator raised)."""
import ctypes
import json
import sys

import torch

import reference
from support import artifact, helper, make_inputs, ops, ordered
from test_c_abi import Call, fn

SHAPE = (2, 3, 130, 16)  # two full 64-key tiles and a partial one


def errors(encoding):
    q, k, v, features, params = make_inputs(encoding, *SHAPE, torch.float32, seed=3)
    dout = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))
    xs = [q, k, v, *features, *[p for p in params.values() if p.requires_grad]]

    def run(fn, inputs):
        o = fn()
        return [o, *torch.autograd.grad(o, inputs, dout.to(o.dtype))]

    got = run(lambda: ops(encoding).attention(q, k, v, *features, *ordered(encoding, params)), xs)
    torch32 = run(lambda: reference.attention(encoding, q, k, v, features, params), xs)
    cast = lambda t: t.detach().double().requires_grad_(t.requires_grad)
    q64, k64, v64 = cast(q), cast(k), cast(v)
    f64, p64 = [cast(f) for f in features], {n: cast(p) for n, p in params.items()}
    xs64 = [q64, k64, v64, *f64, *[p for p in p64.values() if p.requires_grad]]
    exact = run(lambda: reference.attention(encoding, q64, k64, v64, f64, p64), xs64)
    err = lambda a: [(x.detach().double() - e).abs().max().item() for x, e in zip(a, exact)]
    return {"kernel": err(got), "torch": err(torch32),
            "scale": [max(1.0, e.abs().max().item()) for e in exact]}


def c_forward(encoding):
    B, H, T, D = 1, 2, 5, 8
    q, k, v, features, params = make_inputs(encoding, B, H, T, D, torch.float32)
    c = Call(*(t.detach() for t in (q, k, v)), [f.detach() for f in features],
             [params[n].detach() for n in helper(encoding).PARAMS], 0.5)
    o, lse = torch.zeros(B, H, T, D), torch.zeros(B, H, T)
    c.args.o, c.args.lse = c.view(o), lse.data_ptr()
    status = fn(encoding, "forward_f32")(ctypes.byref(c.args))
    return [status, fn(encoding, "last_error")().decode()]


def main(encodings):
    torch.set_num_threads(2)
    c = ctypes.CDLL(artifact(f"{encodings[0]}_c_abi", f"libape_{encodings[0]}_c.so"))
    c_level = getattr(c, f"ape_{encodings[0]}_cpu_level")
    c_level.restype = ctypes.c_char_p
    out = {"torch_level": ops(encodings[0]).cpu_level(), "c_level": c_level().decode(),
           "c_forward": c_forward(encodings[0])}
    for enc in encodings:
        try:
            out[enc] = errors(enc)
        except RuntimeError as e:
            out[enc] = {"error": str(e).splitlines()[0]}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
