//===- ApeOps.td - ops of the ape dialect ------------------*- tablegen -*-===//
#ifndef APE_OPS_TD
#define APE_OPS_TD

include "ApeDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Closed vocabularies (ape/contract/vocabulary.h)
//===----------------------------------------------------------------------===//

// A string attribute whose values form a closed vocabulary of contract/vocabulary.h: the textual
// form stays a string (`pairing = "half"`), the generated verifier refuses any other string with
// the message "attribute 'pairing' failed to satisfy constraint: <allowed>" (`allowed` spells
// the values `::ape_abi::<parser>` accepts, as ::ape_abi::allowed<E>() does), and the accessor
// returns the enum `::ape_abi::<enumName>`.
class Ape_VocabAttr<string enumName, string parser, string allowed> :
    Attr<CPred<"::llvm::isa<::mlir::StringAttr>($_self) && ::ape_abi::" # parser # "("
               "::llvm::cast<::mlir::StringAttr>($_self).getValue()).has_value()">,
         allowed> {
  let storageType = "::mlir::StringAttr";
  let returnType = "::ape_abi::" # enumName;
  let valueType = NoneType;
  let convertFromStorage = "*::ape_abi::" # parser # "($_self.getValue())";
  let constBuilderCall = "$_builder.getStringAttr(::ape_abi::name($0))";
}

def Ape_PairingAttr : Ape_VocabAttr<"Pairing", "parse_pairing",
    "\"none\", \"half\" or \"interleaved\"">;
def Ape_RotationPairingAttr : Ape_VocabAttr<"Pairing", "parse_rotation_pairing",
    "\"half\" or \"interleaved\"">;
def Ape_ScalingAttr : Ape_VocabAttr<"Scaling", "parse_scaling",
    "\"none\", \"linear\", \"ntk\", \"dynamic_ntk\", \"yarn\" or \"llama3\"">;
def Ape_InitKindAttr : Ape_VocabAttr<"InitKind", "parse_init_kind",
    "\"zeros\", \"ones\", \"normal\", \"constant\", \"alibi_slopes\", \"sinusoidal\", "
    "\"projection_term\" or \"projection_prefix\"">;
def Ape_ProjectionAttr : Ape_VocabAttr<"Projection", "parse_projection",
    "\"q\", \"k\" or \"v\"">;
def Ape_OverrideKindAttr : Ape_VocabAttr<"OverrideKind", "parse_override_kind",
    "\"expe\" or \"exqpe\"">;
def Ape_TargetsAttr : Ape_VocabAttr<"Targets", "parse_targets", "\"qk\" or \"qkv\"">;
def Ape_SideAttr : Ape_VocabAttr<"Side", "parse_side", "\"q\" or \"k\"">;
def Ape_DimWhichAttr : Ape_VocabAttr<"DimWhich", "parse_dim_which",
    "\"heads\", \"head_dim\" or \"seq_len\"">;
def Ape_AbsoluteKindAttr : Ape_VocabAttr<"AbsoluteKind", "parse_absolute_kind",
    "\"sinusoidal\" or \"learned\"">;
def Ape_KerpleKindAttr : Ape_VocabAttr<"KerpleKind", "parse_kerple_kind",
    "\"log\" or \"power\"">;
def Ape_CableKernelAttr : Ape_VocabAttr<"CableKernel", "parse_cable_kernel",
    "\"none\" or \"log1p_sq\"">;

//===----------------------------------------------------------------------===//
// Containers
//===----------------------------------------------------------------------===//

def Ape_EncodingOp : Ape_Op<"encoding", [Symbol, NoTerminator, SingleBlock,
                                         IsolatedFromAbove]> {
  let summary = "a positional encoding: a named list of components";
  let description = [{
    The unit a user writes. Its body holds named components and generic forms
    in order; an empty body is NoPE. The optional `scale` attribute overrides
    the logit scale κ (default 1/sqrt(head_dim)). The optional `head_dim` and
    `model_dim` attributes pin the model shape the encoding is written for:
    components are checked against them at compile time (an override's l, a
    rotary's dims) and the runtime refuses a model of another shape. The unit
    attribute `fast_math` lets the CUDA kernels evaluate the encoding's
    score mods' exponentials, logarithms and divisions with the GPU's
    approximate instructions (`-ape-fast-math`: the `afn` and `arcp` flags on
    their ops and derivatives); the CPU kernels stay exact.

    ```mlir
    ape.encoding @nope {
    }
    ape.encoding @cable attributes {scale = 1.0 : f64} {
      ape.cable {kernel = "none"}
    }
    ape.encoding @kcable_fast attributes {fast_math} {
      ape.cable {kernel = "log1p_sq"}
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, OptionalAttr<F64Attr>:$scale,
                       OptionalAttr<I64Attr>:$head_dim, OptionalAttr<I64Attr>:$model_dim,
                       UnitAttr:$fast_math);
  let regions = (region SizedRegion<1>:$body);
  // `custom<ContainerName>($sym_name) attr-dict-with-keyword $body`, by hand for whole numbers
  // given to `scale` (ApeOps.cpp, parseAttrDictOp).
  let hasCustomAssemblyFormat = 1;
  // verify: the op's own attributes; verifyRegions: the nested ops together, after each of them
  // verified (their attributes are then known to be present and well-typed).
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name)>];
}

def Ape_KernelOp : Ape_Op<"kernel", [Symbol, NoTerminator, SingleBlock,
                                     IsolatedFromAbove]> {
  let summary = "the fused attention kernel of one encoding";
  let description = [{
    Produced by `-ape-fuse`: the token program (params, token features, maps,
    scans, in order), at most one `ape.q_mod`, one `ape.k_mod` and one
    `ape.score_mod`, each the composition of every component of the encoding.
    `-ape-differentiate` adds the gradient regions; `-ape-schedule` sets
    `passes`, `tile_q` and `tile_k`. Code generators translate this op.
    `inference_only` (set by `-ape-fuse` when the encoding holds an
    `ape.attention_transition`) marks a kernel without a backward: the
    emitted entry refuses training, and the verifier refuses a transition in a
    kernel without it.

    `-ape-classify` records the facts that choose the kernels' fast paths
    (analysis/KernelFacts.h); an emitter takes a fast path only where its fact
    is recorded, and refuses a recorded fact that does not hold:
    `q_mod_linear` / `k_mod_linear` (the mod is a(t, c) x + b(t, c) y: its
    coefficients are tabulated once per call), `score_bias = "distance"`
    (s + B(i - j): B once per distance), `"row_col"` (s + R(i) + C(j): R
    once per row and C once per column of a tile) or `"features"` (every
    load at the query row, the key column or the slice; where its indices of
    the distance saturate, once per row, column and block of a tile),
    `k_mod_reads_length` and
    `tokens_read_length` (decoding recomputes what it caches).

    ```mlir
    ape.kernel @alibi attributes {causal = true} {
      %m = ape.param "slopes" ["heads"] init = "alibi_slopes"
      ape.score_mod {
      ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
        ...
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, OptionalAttr<F64Attr>:$scale,
                       OptionalAttr<I64Attr>:$head_dim, OptionalAttr<I64Attr>:$model_dim,
                       DefaultValuedAttr<BoolAttr, "true">:$causal,
                       OptionalAttr<I64Attr>:$passes,
                       OptionalAttr<I64Attr>:$tile_q,
                       OptionalAttr<I64Attr>:$tile_k,
                       UnitAttr:$inference_only,
                       UnitAttr:$q_mod_linear, UnitAttr:$k_mod_linear,
                       OptionalAttr<StrAttr>:$score_bias,
                       UnitAttr:$k_mod_reads_length, UnitAttr:$tokens_read_length);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "custom<ContainerName>($sym_name) attr-dict-with-keyword $body";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Named components
//===----------------------------------------------------------------------===//

// The form of an op that is its attribute dictionary alone (`ape.rotary {base = 5.0e5 : f64}`),
// parsed by hand for one thing: a float argument given a whole number (`{base = 500000}`, which
// MLIR reads as an i64) takes that number (ApeOps.cpp, parseAttrDictOp).
defvar Ape_AttrDictForm = [{
  ::mlir::ParseResult $cppClass::parse(::mlir::OpAsmParser &parser, ::mlir::OperationState &result) {
    return ::mlir::ape::parseAttrDictOp(parser, result, &$cppClass::verifyInherentAttrs);
  }
  void $cppClass::print(::mlir::OpAsmPrinter &printer) {
    ::mlir::ape::printAttrDictOp(printer, *this, {});
  }
}];

class Ape_ComponentOp<string mnemonic, list<Trait> traits = []> :
    Ape_Op<mnemonic, !listconcat(traits, [HasParent<"EncodingOp">])> {
  let hasCustomAssemblyFormat = 1;
  let extraClassDefinition = Ape_AttrDictForm;
  let hasVerifier = 1;
}

// A named component that -ape-expand replaces by its generic form. Each one lives in its own
// file, dialect/components/NAME.cpp: its verifier and its expansion (docs/internals.md, section 5,
// "A newcomer's map": a named component).
def Ape_ExpandableComponent : OpInterface<"ExpandableComponent"> {
  let cppNamespace = "::mlir::ape";
  let description = [{
    A named component (ape.rotary, ape.alibi, ...): sugar for the params, token features,
    maps, scans and mod regions it stands for. -ape-expand calls `expand` with a builder placed
    before the op, then erases the op.
  }];
  let methods = [
    InterfaceMethod<[{
      Writes the component's generic form at the builder's insertion point (before the op).
      }], "void", "expand", (ins "::mlir::OpBuilder &":$builder)>,
  ];
}

class Ape_NamedComponentOp<string mnemonic, list<Trait> traits = []> :
    Ape_ComponentOp<mnemonic,
                    !listconcat(traits, [DeclareOpInterfaceMethods<Ape_ExpandableComponent>])>;

def Ape_RotaryOp : Ape_NamedComponentOp<"rotary"> {
  let summary = "rotary position embedding (RoPE) of q and k, with its scalings";
  let description = [{
    Rotates each pair of q/k coordinates by t·θ'_k with θ_k = base^(-2k/d_r),
    d_r = 2·floor(fraction·head_dim/2) rotated coordinates (partial rotary
    when fraction < 1; the rest pass through; with the encoding's `head_dim`
    hint, fraction·head_dim must be an even integer). `pairing` is "half"
    (k with k + d_r/2) or "interleaved" (2k with 2k+1).

    `scaling` rescales the frequencies for longer contexts (s = `factor`,
    L = `original_length`):
      "none"         θ'_k = θ_k
      "linear"       position interpolation, θ'_k = θ_k / s
      "ntk"          base' = base·s^(d_r/(d_r-2))
      "dynamic_ntk"  base' = base·(s·l/L - (s-1))^(d_r/(d_r-2)), l = max(T, L),
                     T the run-time sequence length of the kernel call
      "yarn"         ramp between θ/s and θ over the dimensions whose wavelength
                     lies between `beta_fast` and `beta_slow` rotations in L;
                     q and k are both scaled by mscale = 0.1·ln(s) + 1
      "llama3"       wavelengths above L/`low_freq_factor` use θ/s, below
                     L/`high_freq_factor` keep θ, smooth blend between
    The factor and the original length become fixed params ("rope_factor",
    "rope_original_length", shape ["1"]), so a runtime can change them without
    recompiling (ape-eval --set rope_factor=8). Expands to an `ape.q_mod` and
    an `ape.k_mod`.

    ```mlir
    ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
    ape.rotary {scaling = "yarn", factor = 4.0 : f64, original_length = 2048}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<F64Attr, "10000.0">:$base,
                       DefaultValuedAttr<F64Attr, "1.0">:$fraction,
                       DefaultValuedAttr<Ape_RotationPairingAttr,
                                         "::ape_abi::Pairing::Half">:$pairing,
                       DefaultValuedAttr<Ape_ScalingAttr, "::ape_abi::Scaling::None">:$scaling,
                       OptionalAttr<F64Attr>:$factor,
                       OptionalAttr<I64Attr>:$original_length,
                       DefaultValuedAttr<F64Attr, "32.0">:$beta_fast,
                       DefaultValuedAttr<F64Attr, "1.0">:$beta_slow,
                       DefaultValuedAttr<F64Attr, "1.0">:$low_freq_factor,
                       DefaultValuedAttr<F64Attr, "4.0">:$high_freq_factor);
}

def Ape_XposOp : Ape_NamedComponentOp<"xpos"> {
  let summary = "xPos: interleaved rotation with a per-pair exponential decay";
  let description = [{
    q̃_t = R(t)q_t ⊙ ζ^(t_c/B), k̃_t = R(t)k_t ⊙ ζ^(-t_c/B) with
    ζ_k = (k/(head_dim/2) + γ)/(1 + γ) on both coordinates of pair k,
    B = `scale_base`, γ = `gamma`, interleaved pairs, θ_k = base^(-2k/head_dim)
    and centred positions t_c = t - floor(T/2) (centring cancels in q̃·k̃ and
    keeps both factors in range at long T). Expands to an `ape.q_mod` and an
    `ape.k_mod`.

    ```mlir
    ape.xpos {gamma = 0.4 : f64, scale_base = 512.0 : f64}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<F64Attr, "0.4">:$gamma,
                       DefaultValuedAttr<F64Attr, "512.0">:$scale_base,
                       DefaultValuedAttr<F64Attr, "10000.0">:$base);
}

def Ape_AbsoluteOp : Ape_NamedComponentOp<"absolute"> {
  let summary = "absolute positions added once to the input embedding";
  let description = [{
    `kind = "sinusoidal"`: PE[n, 2k] = sin(n/base^(2k/d)), PE[n, 2k+1] =
    cos(n/base^(2k/d)). `kind = "learned"`: a trained table of `max_length`
    rows initialised N(0, `std`); a longer sequence is an error.
    `scale_embedding` multiplies the token embedding by sqrt(d) first.
    Expands to an `ape.position_embedding`.

    ```mlir
    ape.absolute {kind = "sinusoidal"}
    ape.absolute {kind = "learned", max_length = 1024}
    ```
  }];
  let arguments = (ins Ape_AbsoluteKindAttr:$kind,
                       DefaultValuedAttr<F64Attr, "::ape_abi::kSinusoidBase">:$base,
                       OptionalAttr<I64Attr>:$max_length,
                       DefaultValuedAttr<F64Attr, "0.02">:$std,
                       UnitAttr:$scale_embedding);
}

def Ape_AlibiOp : Ape_NamedComponentOp<"alibi"> {
  let summary = "ALiBi: a linear distance penalty with per-head slopes";
  let description = [{
    B_ij = -m_h·(i - j) with the standard slopes (including the rule for a
    head count that is not a power of two). With `learned`, the slopes are
    trained (initialised to the standard values). Expands to an `ape.param`
    and an `ape.score_mod`.

    ```mlir
    ape.alibi
    ape.alibi {learned}
    ```
  }];
  let arguments = (ins UnitAttr:$learned);
}

def Ape_T5BiasOp : Ape_NamedComponentOp<"t5_bias"> {
  let summary = "T5 relative bias: a learned table over log-spaced distance buckets";
  let description = [{
    B_ij = T[bucket(i - j), h] with n = max(i - j, 0) and (decoder form)
    bucket(n) = n for n < buckets/2, else
    min(buckets/2 + floor(ln(n/(buckets/2)) / ln(max_distance/(buckets/2)) · buckets/2),
        buckets - 1).
    One table [buckets, heads] (init N(0, std)) is shared by every layer; its
    gradient is a scatter by (bucket, head), summed per (batch, head) slice and
    reduced in a fixed order. Expands to an `ape.param` and an `ape.score_mod`.

    ```mlir
    ape.t5_bias {buckets = 32, max_distance = 128}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<I64Attr, "32">:$buckets,
                       DefaultValuedAttr<I64Attr, "128">:$max_distance,
                       DefaultValuedAttr<F64Attr, "0.02">:$std);
}

def Ape_KerpleOp : Ape_NamedComponentOp<"kerple"> {
  let summary = "KERPLE: a learned conditionally positive definite distance kernel";
  let description = [{
    kind "log":   B_ij = -p_h·ln(1 + a_h·(i - j))
    kind "power": B_ij = -a_h·(i - j)^(p_h)
    with per-head p and a (initialised to `p_init`, `a_init`) shared by every
    layer and clamped to >= 0.01 (the power exponent also to <= 2) where they
    are used. Expands to two `ape.param`s and an `ape.score_mod`.

    ```mlir
    ape.kerple {kind = "log"}
    ape.kerple {kind = "power", p_init = 1.5 : f64, a_init = 0.5 : f64}
    ```
  }];
  let arguments = (ins Ape_KerpleKindAttr:$kind,
                       DefaultValuedAttr<F64Attr, "1.0">:$p_init,
                       DefaultValuedAttr<F64Attr, "1.0">:$a_init);
}

def Ape_FireOp : Ape_NamedComponentOp<"fire"> {
  let summary = "FIRE: a learned MLP of the normalised log distance";
  let description = [{
    B_ij = MLP_h(ψ(i - j) / (ψ(max(i, l_init·L)) + 1e-6)) with ψ(x) = ln(|c·x| + 1),
    MLP 1 → `hidden` → heads with ReLU, and c (init `c`) and L (init 1) trained
    with the MLP (one per layer). The MLP is evaluated inside the kernel for
    every (i, j); its weights' gradients are reduced per (batch, head) slice in
    a fixed order. Expands to params and an `ape.score_mod`.

    ```mlir
    ape.fire {hidden = 32, c = 0.1 : f64, l_init = 512.0 : f64}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<I64Attr, "32">:$hidden,
                       DefaultValuedAttr<F64Attr, "0.1">:$c,
                       DefaultValuedAttr<F64Attr, "512.0">:$l_init);
}

def Ape_CableOp : Ape_NamedComponentOp<"cable"> {
  let summary = "Cable: context-aware cumulative biases from the block input";
  let description = [{
    b_t = -softplus(f(x̃_t)) per head with f = Linear(d, H); S_t = Σ_{u<=t} b_u;
    B_ij = S_i - S_j (`kernel = "none"`) or -log(1 + (S_i - S_j)²)
    (`kernel = "log1p_sq"`, K-Cable). `kappa` sets the logit scale.
    Expands to a token feature, a map, a scan and a score_mod.

    ```mlir
    ape.cable {kernel = "none"}
    ape.cable {kernel = "log1p_sq", kappa = 1.0 : f64}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<Ape_CableKernelAttr,
                                         "::ape_abi::CableKernel::None">:$kernel,
                       OptionalAttr<F64Attr>:$kappa,
                       DefaultValuedAttr<F64Attr, "0.02">:$weight_std);
}

def Ape_OverrideOp : Ape_ComponentOp<"override"> {
  let summary = "ExPE / ExQPE: overwrite the first l inputs of the projections";
  let description = [{
    Replaces the first `l` coordinates of the normalised block input that
    feeds W_q and W_k (`targets = "qk"`), and W_v too (`targets = "qkv"`), by
    position values:
      kind "expe":  p_{n,i} = start + theta·(n + i)
      kind "exqpe": p_{n,j} = start + j·theta1 + theta2·c_j(n),
                    c_j(n) = floor(n/l) + [j <= n mod l]
    multiplied by σ, the fixed param "position_scale" (1; an evaluation may
    set 0.5). `-ape-push-override` rewrites it, by linearity of the
    projection, into additive q/k terms σ·(a + n·b) (ExPE) or
    σ·(a + floor(n/l)·b + P[n mod l]) (ExQPE) whose params the runtime derives
    from W every step; the value projection reads the overridden input.

    ```mlir
    ape.override {l = 16, start = 0.0 : f64, theta = 4.8828125e-04 : f64, targets = "qk"}
    ape.override {kind = "exqpe", l = 24, theta1 = 4.8828125e-04 : f64, theta2 = 6.25e-02 : f64}
    ```
  }];
  let arguments = (ins DefaultValuedAttr<Ape_OverrideKindAttr,
                                         "::ape_abi::OverrideKind::Expe">:$kind,
                       I64Attr:$l,
                       DefaultValuedAttr<F64Attr, "0.0">:$start,
                       DefaultValuedAttr<F64Attr, "4.8828125e-04">:$theta,
                       DefaultValuedAttr<F64Attr, "4.8828125e-04">:$theta1,
                       DefaultValuedAttr<F64Attr, "6.25e-02">:$theta2,
                       DefaultValuedAttr<Ape_TargetsAttr, "::ape_abi::Targets::Qk">:$targets);
}

//===----------------------------------------------------------------------===//
// Generic forms
//===----------------------------------------------------------------------===//

def Ape_ParamOp : Ape_Op<"param", [Pure]> {
  let summary = "a learned or fixed tensor of the encoding";
  let description = [{
    `shape` lists symbolic dimensions ("heads", "head_dim") or integers as
    strings. `init` is one of "zeros", "ones", "normal" (argument `std`),
    "constant" (argument `value`), "alibi_slopes", "sinusoidal" (shape
    [rows, "heads", "head_dim"]: the sinusoidal table PE[r, h·head_dim + c]),
    "projection_term" (derived every step from a projection weight:
    arguments `projection`, `columns`, `start`, `step`) or
    "projection_prefix" (derived: `projection`, `columns`, `scale`); a kind
    takes exactly the arguments it needs (ape/contract/vocabulary.h, init_arg_use). Without
    `trainable` it is a fixed buffer; `shared` makes one tensor serve every
    layer.
    A fixed "constant" param may declare the values it can take with `min`,
    `max` (f64, inclusive) and `integer`: its `value` is checked against them,
    and so is a value a runtime sets later (`ape-eval --set`; the manifest
    carries them as "range").

    ```mlir
    %m = ape.param "slopes" ["heads"] init = "alibi_slopes"
    %w = ape.param "w" ["heads", "4"] init = "normal" trainable {std = 0.02 : f64}
    %s = ape.param "rope_factor" ["1"] init = "constant" {value = 4.0 : f64,
                                                          min = 1.0e-30 : f64, max = 1.0e30 : f64}
    ```
  }];
  let arguments = (ins StrAttr:$name, StrArrayAttr:$shape, Ape_InitKindAttr:$init,
                       UnitAttr:$trainable,
                       // The init arguments: which kind needs which is one table,
                       // ::ape_abi::init_arg_use; the verifier refuses the others.
                       OptionalAttr<F64Attr>:$std,
                       OptionalAttr<F64Attr>:$value,
                       OptionalAttr<Ape_ProjectionAttr>:$projection,
                       OptionalAttr<I64Attr>:$columns,
                       OptionalAttr<F64Attr>:$start,
                       OptionalAttr<F64Attr>:$step,
                       OptionalAttr<F64Attr>:$scale,
                       // The values a fixed "constant" param may take (ape_rules::Range).
                       OptionalAttr<F64Attr>:$min,
                       OptionalAttr<F64Attr>:$max,
                       UnitAttr:$integer,
                       // One tensor for every layer (the manifest's per_layer = false).
                       UnitAttr:$shared);
  let results = (outs Ape_ParamType:$result);
  // The generated form, parsed by hand so that a whole number given for a float argument
  // (`{value = 64}`) is read as that number (ApeOps.cpp, ParamOp::parse).
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
}

def Ape_TokenFeatureOp : Ape_Op<"token_feature", [Pure]> {
  let summary = "a learned per-head feature of each token: w_h·x̃_t + c_h";
  let description = [{
    A Linear(d, heads) of the normalised block input, computed by the runtime
    every layer, its weight initialised N(0, weight_std) and its bias to
    `bias`. Its gradient flows back through the kernel.

    ```mlir
    %f = ape.token_feature "gate" {weight_std = 0.02 : f64, bias = 0.0 : f64}
    ```
  }];
  let arguments = (ins StrAttr:$name,
                       DefaultValuedAttr<F64Attr, "0.02">:$weight_std,
                       DefaultValuedAttr<F64Attr, "0.0">:$bias);
  let results = (outs Ape_TokensType:$result);
  // `$name attr-dict`, by hand: a whole number for a float argument (ApeOps.cpp).
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
}

def Ape_RelRowsOp : Ape_Op<"rel_rows", [Pure]> {
  let summary = "dot products of q' (or k') with each row of a relative table";
  let description = [{
    R[b, h, t, r] = (x'_t + bias[h]) · table[r, h, :] where x' is q' (side
    "q") or k' (side "k") after the q/k mods, `table` a param of shape
    [rows, "heads", "head_dim"] and the optional `bias` a param
    ["heads", "head_dim"]. The kernel computes the rows per (batch, head)
    once, a small GEMM, so a score_mod can add q-dependent relative terms
    (Shaw, Transformer-XL, DeBERTa) by gathering R at a computed distance
    index without materialising T×T. Gradients flow to q/k, the table and the
    bias.

    ```mlir
    %rk = ape.rel_rows "q" %table
    %rq = ape.rel_rows "k" %table bias %u
    ```
  }];
  let arguments = (ins Ape_SideAttr:$side, Ape_ParamType:$table, Optional<Ape_ParamType>:$bias);
  let results = (outs Ape_RowsType:$result);
  let assemblyFormat = "$side $table (`bias` $bias^)? attr-dict";
  let hasVerifier = 1;
}

def Ape_ValueRowsOp : Ape_Op<"value_rows", [NoTerminator]> {
  let summary = "a relative term added to the attention output: o_i += Σ_j P_ij·table[r(i, j)]";
  let description = [{
    The value-side relative term (Shaw's a^V): every probability P_ij also
    weighs the row r(i, j) of `table` (a param [rows, "heads", "head_dim"]),
    where the `index` region computes r from (b, h, i, j). The kernel keeps
    per query the probability mass of each row (online, like the softmax sum)
    and adds mass·table at the end, so no T×T matrix is formed; the backward
    adds dO_i·table[r] to dP_ij and sends Σ_i mass_i[r]·dO_i to the table.

    ```mlir
    ape.value_rows %av index {
    ^bb0(%b: index, %h: index, %i: index, %j: index):
      ...
      ape.yield %r : index
    }
    ```
  }];
  let arguments = (ins Ape_ParamType:$table);
  let regions = (region SizedRegion<1>:$index);
  let assemblyFormat = "$table attr-dict `index` $index";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def Ape_AttentionTransitionOp : Ape_Op<"attention_transition"> {
  let summary = "the attention transition: post-softmax redistribution of mass (inference only)";
  let description = [{
    The prob site (shared/spec/encodings.md, "Attention transition (P)"): while a
    prompt of T tokens is processed by a model of N layers (0-based), with
    I = floor(T / (N + `divisor_offset`)) rounded down to a multiple of 5, the
    layers `first_layer` (>= 1) .. N-1-`skip_last` each transform `intervals`
    consecutive intervals of query rows, [(l+1+k)I, (l+2+k)I) for layer l. On a
    row r of an interval [s, e), with post-softmax weights A: bound = `alpha`/e;
    weights below the bound (keys c < e) are zeroed and A[r, 0] halved; the
    removed mass E = 1 - Σ A goes back, `beta`·E in all, to the window of keys
    [s-2I, s): 7/10 of each unit to [s-I, s), 3/10 to [s-2I, s-I), in
    proportion to a mask (1 where the weight is kept, 0.01 elsewhere). Rows are
    not renormalised. I < 5 is a no-op. The defaults are the spec's (divisor
    N + 1, layers 1 .. N-3, two intervals, alpha 0.5, beta 0.1).

    It has no derivative: a kernel holding it is `inference_only` (-ape-fuse
    marks it), has no backward, and a training run refuses it. The layer index
    and the depth N reach the kernel at run time. The fused CPU kernel takes
    three passes over the keys of a transformed row (the log-sum-exp, the kept
    mass and mask sum, the output) and stores no T×T matrix; not supported on
    CUDA yet, nor with `ape.value_rows`.

    ```mlir
    ape.encoding @rope_transition {
      ape.rotary {base = 10000.0 : f64}
      ape.attention_transition {alpha = 0.5 : f64, beta = 0.1 : f64, intervals = 2}
    }
    ```
  }];
  let arguments = (ins DefaultValuedAttr<I64Attr, "1">:$divisor_offset,
                       DefaultValuedAttr<I64Attr, "1">:$first_layer,
                       DefaultValuedAttr<I64Attr, "2">:$skip_last,
                       DefaultValuedAttr<I64Attr, "2">:$intervals,
                       DefaultValuedAttr<F64Attr, "0.5">:$alpha,
                       DefaultValuedAttr<F64Attr, "0.1">:$beta);
  let hasCustomAssemblyFormat = 1;
  let extraClassDefinition = Ape_AttrDictForm;
  let hasVerifier = 1;
}

class Ape_RegionOp<string mnemonic, list<Trait> traits = []> :
    Ape_Op<mnemonic, traits> {
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def Ape_MapOp : Ape_RegionOp<"map"> {
  let summary = "an elementwise function of a token sequence";
  let description = [{
    `body` maps one f32 to one f32. After `-ape-differentiate` the `grad`
    region maps (x, g) to g·f'(x).

    ```mlir
    %b = ape.map %f {
    ^bb0(%x: f32):
      %y = math.exp %x : f32
      ape.yield %y : f32
    }
    ```
  }];
  let arguments = (ins Ape_TokensType:$input);
  let results = (outs Ape_TokensType:$result);
  let regions = (region SizedRegion<1>:$body, AnyRegion:$grad);
  let assemblyFormat = "$input attr-dict-with-keyword $body (`grad` $grad^)?";
}

def Ape_ScanOp : Ape_Op<"scan", [Pure]> {
  let summary = "inclusive prefix sum of a token sequence along the tokens";
  let description = [{
    c_t = Σ_{u<=t} x_u per batch and head. Its gradient is the reverse
    cumulative sum.

    ```mlir
    %c = ape.scan %b
    ```
  }];
  let arguments = (ins Ape_TokensType:$input);
  let results = (outs Ape_TokensType:$result);
  let assemblyFormat = "$input attr-dict";
}

class Ape_QKModOp<string mnemonic, string which> : Ape_RegionOp<mnemonic> {
  let summary = "an elementwise transform of " # which # " with its pair partner";
  let description = [{
    Block arguments: (x: f32, y: f32, c: index, t: index, h: index), where x
    is coordinate c of }] # which # [{ at position t in head h and y the coordinate
    paired with c (`pairing` "half", "interleaved" or "none"; the first
    2·floor(fraction·head_dim/2) coordinates are paired, the rest are their own
    partner). The body yields the new value of coordinate c. After
    `-ape-differentiate`, `grad` takes (x, y, c, t, h, g) and yields
    (g·∂f/∂x, g·∂f/∂y, g·∂f/∂load_0, ...).
  }];
  let arguments = (ins DefaultValuedAttr<Ape_PairingAttr, "::ape_abi::Pairing::None">:$pairing,
                       DefaultValuedAttr<F64Attr, "1.0">:$fraction);
  let regions = (region SizedRegion<1>:$body, AnyRegion:$grad);
  // `attr-dict-with-keyword $body (`grad` $grad^)?`, by hand for a whole number given to
  // `fraction` (ApeOps.cpp, parseAttrDictOp).
  let hasCustomAssemblyFormat = 1;
  let extraClassDefinition = [{
    ::mlir::ParseResult $cppClass::parse(::mlir::OpAsmParser &parser,
                                         ::mlir::OperationState &result) {
      if (::mlir::ape::parseAttrDictOp(parser, result, &$cppClass::verifyInherentAttrs, true))
        return ::mlir::failure();
      return ::mlir::ape::parseRegions(parser, result, true, "grad");
    }
    void $cppClass::print(::mlir::OpAsmPrinter &printer) {
      ::mlir::ape::printAttrDictOp(printer, *this, {}, true);
      printer << ' ';
      printer.printRegion(getBody());
      ::mlir::ape::printOptionalRegion(printer, "grad", getGrad());
    }
  }];
}

def Ape_QModOp : Ape_QKModOp<"q_mod", "q">;
def Ape_KModOp : Ape_QKModOp<"k_mod", "k">;

def Ape_ScoreModOp : Ape_RegionOp<"score_mod"> {
  let summary = "a transform of the attention logit";
  let description = [{
    Block arguments: (s: f32, b: index, h: index, i: index, j: index), where s
    is κ·q_i·k_j (after the q/k mods) for query i, key j, head h, batch b.
    The body yields the new logit. Several score_mods chain in order. After
    `-ape-differentiate`, `grad` takes (s, b, h, i, j, g) and yields
    (g·∂f/∂s, g·∂f/∂load_0, ...).

    ```mlir
    ape.score_mod {
    ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
      %ci = ape.load %c[%b, %h, %i] : !ape.tokens
      %cj = ape.load %c[%b, %h, %j] : !ape.tokens
      %d = arith.subf %ci, %cj : f32
      %r = arith.addf %s, %d : f32
      ape.yield %r : f32
    }
    ```
  }];
  let regions = (region SizedRegion<1>:$body, AnyRegion:$grad);
  let assemblyFormat = "attr-dict-with-keyword $body (`grad` $grad^)?";
}

def Ape_LoadOp : Ape_Op<"load", [Pure]> {
  let summary = "read a token sequence or a parameter inside a region";
  let description = [{
    Tokens take three indices [batch, head, token]; a parameter takes one
    index per dimension of its shape.

    ```mlir
    %v = ape.load %c[%b, %h, %i] : !ape.tokens
    %m = ape.load %slopes[%h] : !ape.param
    ```
  }];
  let arguments = (ins Ape_AnyValue:$source, Variadic<Index>:$indices);
  let results = (outs F32:$result);
  let assemblyFormat = "$source `[` $indices `]` attr-dict `:` type($source)";
  let hasVerifier = 1;
}

def Ape_ConstantOp : Ape_Op<"constant", [Pure]> {
  let summary = "a real constant of a region, exact at every precision";
  let description = [{
    Holds the value as f64 while the region computes in f32 types: the code
    generators write it at the precision of the kernel (so 0.1 or 2π are as
    exact in an fp64 kernel as the fp64 reference). `arith.constant` of f32
    rounds to single precision; use this for values f32 cannot represent.
    Deliberately not folded: arithmetic on it stays in the region.

    ```mlir
    %tenth = ape.constant 0.1
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs F32:$result);
  let assemblyFormat = "$value attr-dict";
  let hasVerifier = 1;
}

def Ape_DimOp : Ape_Op<"dim", [Pure]> {
  let summary = "a run-time size: heads, head_dim or seq_len";
  let description = [{
    ```mlir
    %d = ape.dim "head_dim"
    ```
  }];
  let arguments = (ins Ape_DimWhichAttr:$which);
  let results = (outs Index:$result);
  let assemblyFormat = "$which attr-dict";
  let hasVerifier = 1;
}

def Ape_MaskedProjectionOp : Ape_Op<"masked_projection"> {
  let summary = "project only the inputs past the first l (override rewrite)";
  let description = [{
    Written by `-ape-push-override`: the runtime projects x̃[..., l:] through
    W[:, l:] for q and k; their position part arrives as additive q/k terms.
    With `targets = "qkv"` the value projection reads the overridden input
    itself: x̃ with its first l coordinates replaced by σ·p_n, p_n given by
    `kind` ("expe" or "exqpe"), `start`, `theta`, `theta1`, `theta2` as in
    ape.override and σ the value of the fixed param named `position_scale`.

    ```mlir
    ape.masked_projection {l = 16 : i64, targets = "qk"}
    ```
  }];
  let arguments = (ins I64Attr:$l, Ape_TargetsAttr:$targets,
                       DefaultValuedAttr<Ape_OverrideKindAttr,
                                         "::ape_abi::OverrideKind::Expe">:$kind,
                       DefaultValuedAttr<F64Attr, "0.0">:$start,
                       DefaultValuedAttr<F64Attr, "4.8828125e-04">:$theta,
                       DefaultValuedAttr<F64Attr, "4.8828125e-04">:$theta1,
                       DefaultValuedAttr<F64Attr, "6.25e-02">:$theta2,
                       OptionalAttr<StrAttr>:$position_scale);
  let hasCustomAssemblyFormat = 1;
  let extraClassDefinition = Ape_AttrDictForm;
  let hasVerifier = 1;
}

def Ape_PositionEmbeddingOp : Ape_Op<"position_embedding", [NoTerminator]> {
  let summary = "absolute positions added to the input embedding (site E)";
  let description = [{
    With `learned`: a trained table [max_length, model_dim], initialised
    N(0, std). Otherwise the `table` region gives entry (n, c) of a fixed
    table from its block arguments (n: index, c: index, d: index) — the
    generated code evaluates it in double precision. With `scale_embedding`
    the token embedding is multiplied by sqrt(model_dim) first. The runtime
    adds the table's first T rows to the embedding once, before the blocks.

    ```mlir
    ape.position_embedding {learned, max_length = 1024 : i64, std = 0.02 : f64}
    ape.position_embedding table {
    ^bb0(%n: index, %c: index, %d: index):
      ...
      ape.yield %v : f32
    }
    ```
  }];
  let arguments = (ins UnitAttr:$learned, OptionalAttr<I64Attr>:$max_length,
                       DefaultValuedAttr<F64Attr, "0.02">:$std, UnitAttr:$scale_embedding);
  let regions = (region AnyRegion:$table);
  // `attr-dict (`table` $table^)?`, by hand for a whole number given to `std` (ApeOps.cpp).
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def Ape_YieldOp : Ape_Op<"yield", [Pure, Terminator]> {
  let summary = "the values a region yields";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, ::mlir::ValueRange()); }]>];
}

#endif // APE_OPS_TD
