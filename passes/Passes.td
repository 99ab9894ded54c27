//===- Passes.td - the ape passes --------------------------*- tablegen -*-===//
#ifndef APE_PASSES_TD
#define APE_PASSES_TD

include "mlir/Pass/PassBase.td"

def ApeExpand : Pass<"ape-expand", "mlir::ModuleOp"> {
  let summary = "Expand named components into generic forms";
  let description = [{
    Rewrites every named component of an `ape.encoding` into the generic
    forms it stands for, in place and in order:

    ```mlir
    // before
    ape.encoding @alibi { ape.alibi }
    // after
    ape.encoding @alibi {
      %0 = ape.param "alibi_slopes" ["heads"] init = "alibi_slopes"
      ape.score_mod {
      ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
        %m = ape.load %0[%h] : !ape.param
        ...                                   // s - m·(i - j)
        ape.yield %r : f32
      }
    }
    ```
    ape.rotary becomes a q_mod and a k_mod; ape.cable a token feature, a map
    (-softplus), a scan and a score_mod; ape.override is left to
    `-ape-push-override`.
  }];
  let dependentDialects = ["mlir::arith::ArithDialect", "mlir::math::MathDialect"];
}

def ApePushOverride : Pass<"ape-push-override", "mlir::ModuleOp"> {
  let summary = "Push an input override through the linear q/k projection";
  let description = [{
    W·override(x, p_n) = W[:, l:]·x[l:] + W[:, :l]·p_n, and for ExPE
    (p_{n,i} = S + θ(n + i)) W[:, :l]·p_n = a + n·b with
    a = W[:, :l]·(S + θ·i)_i and b = θ·W[:, :l]·1. The override becomes an
    `ape.masked_projection` (the runtime projects x[..., l:] only, no copy of
    x), two `projection_term` params per target and an additive q_mod/k_mod,
    placed first in the encoding: the override acts on the projection input,
    so the additive term comes before any rotation of q and k.

    ```mlir
    // before
    ape.override {l = 8 : i64, targets = "qk"}
    // after
    ape.masked_projection {l = 8 : i64, targets = "qk"}
    %a = ape.param "override_q_a" ["heads", "head_dim"] init = "projection_term" trainable {...}
    %b = ape.param "override_q_b" ["heads", "head_dim"] init = "projection_term" trainable {...}
    ape.q_mod { ... x + a[h, c] + t·b[h, c] ... }
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect"];
}

def ApeFastMath : Pass<"ape-fast-math", "mlir::ModuleOp"> {
  let summary = "Mark the arithmetic of fast_math encodings as approximable";
  let description = [{
    In every `ape.encoding` that carries `fast_math`, sets the fast-math flags
    `afn` (approximate functions) and `arcp` (division by a reciprocal) on
    the arith/math ops of its score mods, keeping any flags already there:
    the per-element arithmetic, whose errors land in one logit each. The
    token program and the q/k mods (cheap, and feeding scans) stay exact, as
    do ops whose value reaches a comparison or a rounding to an integer (T5's
    bucket), where an approximation could move a boundary.
    `-ape-differentiate` gives the ops it derives from an op that op's flags,
    so the backward follows. The CUDA emitter writes the ops so flagged with
    the GPU's approximate instructions (exp, exp2, log, log2 and log1p by
    MUFU.EX2 / MUFU.LG2, a division by MUFU.RCP and a product:
    ape/cuda/platform.cuh, `approx`); the CPU emitter and the references
    ignore the flags. A region written by hand may also flag single ops.

    ```mlir
    // before
    ape.encoding @k attributes {fast_math} { ape.score_mod { ... math.log1p %x : f32 ... } }
    // after
    ape.encoding @k attributes {fast_math} {
      ape.score_mod { ... math.log1p %x fastmath<arcp,afn> : f32 ... }
    }
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect"];
}

def ApeExactFold : Pass<"ape-exact-fold", "mlir::ModuleOp"> {
  let summary = "Fold the regions' constant float arithmetic in double";
  let description = [{
    Replaces every f32 arith/math op whose operands are all constants
    (`arith.constant`, `ape.constant`) by its value computed in double: an
    `arith.constant` where f32 holds it exactly, an `ape.constant` otherwise,
    so that an fp64 kernel computes what the spec says. The canonicalizer
    would fold them in the ops' f32 type: `math.log 4.0` became 1.38629436f,
    and an fp64 kernel's `floor(2 ln(2) / ln(4))` gave 0 where the spec (and
    the fp64 reference) give 1; the derivative of `s / 3.0` became the float
    0.333333343. Runs before the canonicalizer in the lowering and on each
    gradient region in `-ape-differentiate`.

    ```mlir
    // before
    %c = arith.constant 4.0 : f32
    %l = math.log %c : f32
    // after
    %l = ape.constant 1.3862943611198906
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect"];
}

def ApeFuse : Pass<"ape-fuse", "mlir::ModuleOp"> {
  let summary = "Fuse all components of each encoding into one ape.kernel";
  let description = [{
    Replaces every fully expanded `ape.encoding` by one `ape.kernel`: the
    token program is kept in order, q_mods compose (the later applies to the
    result of the earlier, the composite tracks each coordinate's partner;
    paired mods must share pairing and fraction), k_mods likewise, and
    score_mods chain (s' = f2(f1(s))). The logit scale (encoding `scale` or
    cable `kappa`) becomes the kernel's `scale`. An `ape.attention_transition`
    (the prob site) moves over unchanged and marks the kernel
    `inference_only`: it has no derivative, so the kernel has no backward.

    ```mlir
    // before
    ape.encoding @e { ape.q_mod {...} ape.score_mod {A} ape.score_mod {B} }
    // after
    ape.kernel @e { ape.q_mod {...} ape.score_mod { B(A(s)) } }
    ```
  }];
}

def ApeDifferentiate : Pass<"ape-differentiate", "mlir::ModuleOp"> {
  let summary = "Derive the backward regions";
  let description = [{
    Adds a `grad` region to every map, q_mod, k_mod and score_mod of an
    `ape.kernel` by symbolic differentiation of its arith/math body: the
    grad region yields g times the partial derivative of the body for each
    value argument and each ape.load, in op order (fixed params get 0). An
    `inference_only` kernel (one holding an `ape.attention_transition`, which
    has no derivative) is left alone: it has no backward.

    ```mlir
    // before
    ape.score_mod { ^bb0(%s, %b, %h, %i, %j): %ci = ape.load %c[%b, %h, %i] ... s + ci - cj }
    // after
    ape.score_mod { ... }
    grad { ^bb0(%s, %b, %h, %i, %j, %g): ape.yield %g, %g, -%g }
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect", "mlir::math::MathDialect"];
}

def ApeSchedule : Pass<"ape-schedule", "mlir::ModuleOp"> {
  let summary = "Choose the pass structure and tile sizes of each kernel";
  let description = [{
    One pass over K/V with online softmax, and the CPU tile sizes; three
    passes for a kernel holding an `ape.attention_transition`, which reads a
    row's final weights (row log-sum-exp, then the kept mass and mask sums,
    then the output).

    ```mlir
    // before
    ape.kernel @e { ... }
    // after
    ape.kernel @e attributes {passes = 1 : i64, tile_k = 64 : i64, tile_q = 64 : i64} { ... }
    ```
  }];
  let options = [
    Option<"tileQ", "tile-q", "int64_t", "64", "query rows per tile">,
    Option<"tileK", "tile-k", "int64_t", "64", "key columns per tile">,
  ];
}

def ApeClassify : Pass<"ape-classify", "mlir::ModuleOp"> {
  let summary = "Record the facts that choose each kernel's fast paths";
  let description = [{
    Sets the attributes of every `ape.kernel` that say which fast paths its
    regions allow (analysis/KernelFacts.h), replacing any set before:
    `q_mod_linear`, `k_mod_linear` (a mod linear in its data: the CPU
    template tabulates its coefficients once per call), `score_bias` =
    `"distance"` (s + B(i - j)), `"row_col"` (s + R(i) + C(j), kernels
    with a backward) or `"features"` (every load of the score mod at the query
    row, the key column or the slice, with indices of the distance that
    saturate: the CUDA flash backward's feature steps), `k_mod_reads_length` and `tokens_read_length` (what
    decoding must recompute at every step). The emitters read them.

    ```mlir
    // before
    ape.kernel @rope_alibi attributes {passes = 1 : i64, ...} { ... }
    // after
    ape.kernel @rope_alibi attributes {k_mod_linear, passes = 1 : i64,
        q_mod_linear, score_bias = "distance", ...} { ... }
    ```
  }];
}

#endif // APE_PASSES_TD
