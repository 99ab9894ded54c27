"""A spec whose score mod is a DAG of shared values, N levels of x + x (apec-forward-reference.test):
`index` as a param load's index, `bias` as a row term added to the score; or `product`: a running
product of N param loads (each load's derivative reaches every later product)."""
import sys

kind, n = sys.argv[1], int(sys.argv[2])
lines = ["ape.encoding @dag {"]
if kind == "index":
    lines += ['  %p = ape.param "tab" ["64"] init = "zeros" trainable',
              "  ape.score_mod {",
              "  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):",
              "    %x0 = arith.addi %i, %j : index"]
    lines += [f"    %x{k + 1} = arith.addi %x{k}, %x{k} : index" for k in range(n)]
    lines += ["    %c63 = arith.constant 63 : index",
              f"    %r = arith.minui %x{n}, %c63 : index",
              "    %v = ape.load %p[%r] : !ape.param",
              "    %o = arith.mulf %s, %v : f32"]
elif kind == "product":
    lines += ['  %p = ape.param "tab" ["4096"] init = "zeros" trainable',
              "  ape.score_mod {",
              "  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):",
              "    %x0 = arith.addf %s, %s : f32"]
    for k in range(n):
        lines += [f"    %c{k} = arith.constant {k} : index",
                  f"    %l{k} = ape.load %p[%c{k}] : !ape.param",
                  f"    %x{k + 1} = arith.mulf %x{k}, %l{k} : f32"]
    lines += [f"    %o = arith.addf %s, %x{n} : f32"]
else:
    lines += ['  %p = ape.param "tab" ["4096"] init = "zeros" trainable',
              "  ape.score_mod {",
              "  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):",
              "    %x0 = ape.load %p[%i] : !ape.param"]
    lines += [f"    %x{k + 1} = arith.addf %x{k}, %x{k} : f32" for k in range(n)]
    lines += [f"    %o = arith.addf %s, %x{n} : f32"]
lines += ["    ape.yield %o : f32", "  }", "}"]
print("\n".join(lines))
