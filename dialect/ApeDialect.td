//===- ApeDialect.td - the ape dialect ---------------------*- tablegen -*-===//
//
// The `ape` dialect describes positional encodings of attention: where they
// act (embedding, projection input, q/k, logits), what they learn, and how
// they compose. Named components (ape.rotary, ape.alibi, ape.cable,
// ape.override) lower to generic forms (params, token features, maps, scans,
// q/k/score mod regions) that passes fuse into one ape.kernel.
//
//===----------------------------------------------------------------------===//
#ifndef APE_DIALECT_TD
#define APE_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Ape_Dialect : Dialect {
  let name = "ape";
  let cppNamespace = "::mlir::ape";
  let summary = "Positional encodings of attention, written once and compiled to fused kernels.";
  let description = [{
    A positional encoding is an `ape.encoding` symbol holding components. The
    named components are sugar for the generic forms; passes expand them,
    push overrides through the projections, fuse everything into one
    `ape.kernel`, derive the backward regions and schedule the kernel.

    ```mlir
    ape.encoding @rope_alibi {
      ape.rotary {base = 10000.0 : f64, fraction = 1.0 : f64, pairing = "half"}
      ape.alibi
    }
    ```
  }];
  let useDefaultTypePrinterParser = 1;
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

class Ape_Type<string name, string typeMnemonic> : TypeDef<Ape_Dialect, name> {
  let mnemonic = typeMnemonic;
}

def Ape_TokensType : Ape_Type<"Tokens", "tokens"> {
  let summary = "a scalar per (batch, head, token)";
  let description = [{
    A sequence value: one scalar per batch, head and token position, such as
    a token feature computed from the block input, a map of one, or a scan.
    Loaded inside regions as `ape.load %x[%b, %h, %t]`.
  }];
}

def Ape_ParamType : Ape_Type<"Param", "param"> {
  let summary = "a learned or fixed tensor";
  let description = [{
    A parameter of the encoding with a symbolic shape (`heads`, `head_dim` or
    integers), created and initialised by the runtime from the manifest.
  }];
}

def Ape_RowsType : Ape_Type<"Rows", "rows"> {
  let summary = "a short row of values per (batch, head, token)";
  let description = [{
    R[b, h, t, r]: for every token a few values indexed by r, such as the dot
    products of q'_t with each row of a relative-position table. Loaded inside
    a score_mod as `ape.load %R[%b, %h, %i, %r]` (query rows) or
    `[%b, %h, %j, %r]` (key rows) with a computed r.
  }];
}

def Ape_AnyValue : AnyTypeOf<[Ape_TokensType, Ape_ParamType, Ape_RowsType]>;

class Ape_Op<string mnemonic, list<Trait> traits = []> :
    Op<Ape_Dialect, mnemonic, traits>;

#endif // APE_DIALECT_TD
