"""Writes a spec of long chains of ops: chain.py KIND MODS OPS > spec.mlir

KIND fused: an encoding of MODS score mods of OPS chained multiplications each (under the verifier's
10,000 ops a region), and one more whose param load is indexed by the logit, so that the fused
kernel's region chains MODS x OPS ops and the analyses of its features walk all of them.
KIND kernel: a hand-written ape.kernel whose one score mod chains MODS x OPS ops (the verifier's
bound is on an encoding's regions).
"""
import sys

kind, mods, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
head = "  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
out = []
if kind == "fused":
    out.append('ape.encoding @chain {\n  %p = ape.param "p" ["16"] init = "ones" trainable\n')
    for _ in range(mods):
        out.append("  ape.score_mod {\n" + head + "    %c = arith.constant 1.0001 : f32\n"
                   "    %x0 = arith.mulf %s, %c : f32\n")
        out += [f"    %x{k} = arith.mulf %x{k - 1}, %c : f32\n" for k in range(1, ops)]
        out.append(f"    ape.yield %x{ops - 1} : f32\n  }}\n")
    out.append("  ape.score_mod {\n" + head + "    %k = arith.fptosi %s : f32 to i64\n"
               "    %ki = arith.index_cast %k : i64 to index\n    %v = ape.load %p[%ki] : !ape.param\n"
               "    %r = arith.addf %s, %v : f32\n    ape.yield %r : f32\n  }\n}\n")
elif kind == "kernel":
    n = mods * ops
    out.append("ape.encoding @dummy {\n}\nape.kernel @chain {\n  ape.score_mod {\n" + head +
               "    %i64 = arith.index_cast %i : index to i64\n    %x0 = arith.sitofp %i64 : i64 to f32\n"
               "    %c = arith.constant 1.0001 : f32\n")
    out += [f"    %x{k} = arith.mulf %x{k - 1}, %c : f32\n" for k in range(1, n + 1)]
    out.append(f"    %r = arith.addf %s, %x{n} : f32\n    ape.yield %r : f32\n  }}\n}}\n")
else:
    sys.exit("unknown kind " + kind)
print("".join(out), end="")
