"""Writes a spec nested DEPTH levels deep in one way: nest.py KIND DEPTH > spec.mlir

KIND: regions (ape.encoding in ape.encoding), score_mod (regions of score_mods), array, paren,
dict, type (tuple<...>), loc (fused[...] locations), mixed (all brackets in turn).
"""
import sys

kind, depth = sys.argv[1], int(sys.argv[2])
n = depth - 1  # the spec itself opens one level
if kind == "regions":
    print("ape.encoding @a {\n" * depth + "}\n" * depth, end="")
elif kind == "score_mod":
    print("ape.encoding @a {\n" + "ape.score_mod {\n" * n + "}\n" * n + "}")
elif kind == "array":
    print("ape.encoding @a attributes {x = " + "[" * n + "]" * n + "} {\n}")
elif kind == "paren":
    print("ape.encoding @a attributes {x = " + "(" * n + ")" * n + "} {\n}")
elif kind == "dict":
    print("ape.encoding @a attributes {x = " + "{a = " * n + "1" + "}" * n + "} {\n}")
elif kind == "type":
    print("ape.encoding @a attributes {x = dense<0> : " + "tuple<" * n + "f32" + ">" * n + "} {\n}")
elif kind == "loc":
    print("ape.encoding @a {\n} loc(" + "fused[" * n + "]" * n + ")")
elif kind == "mixed":
    opens, closes = "[({<", "])}>"
    body = "".join(opens[k % 4] for k in range(n)) + "".join(closes[k % 4] for k in reversed(range(n)))
    print("ape.encoding @a attributes {x = " + body + "} {\n}")
else:
    sys.exit("unknown kind " + kind)
