// DeBERTa-style disentangled relative terms (decoder form), in the generic form:
//   l_ij += (q_i·K_δ + k_j·Q_δ) / sqrt(d_h),  δ = bucket(i - j),
// content-to-position (query rows over the table K) plus position-to-content (key rows over Q),
// with T5's log buckets (32 buckets, max distance 128). Each table is [32, heads, head_dim].
ape.encoding @deberta {
  %kr = ape.param "deberta_c2p" ["32", "heads", "head_dim"] init = "normal" trainable {std = 0.02 : f64}
  %qr = ape.param "deberta_p2c" ["32", "heads", "head_dim"] init = "normal" trainable {std = 0.02 : f64}
  %c2p = ape.rel_rows "q" %kr
  %p2c = ape.rel_rows "k" %qr
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    // δ = n below 16, else 16 + floor(ln(n/16)·16/ln 8) capped at 31, n = max(i - j, 0)
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %d = arith.subi %i, %j : index
    %n = arith.maxsi %d, %c0 : index
    %small = arith.cmpi slt, %n, %c16 : index
    %nl = arith.maxsi %n, %c16 : index
    %n64 = arith.index_cast %nl : index to i64
    %nf = arith.sitofp %n64 : i64 to f32
    %f16 = arith.constant 16.0 : f32
    %ratio = arith.divf %nf, %f16 : f32
    %log = math.log %ratio : f32
    %per = ape.constant 7.6943735514078053
    %steps = arith.mulf %log, %per : f32
    %fl = math.floor %steps : f32
    %s64 = arith.fptosi %fl : f32 to i64
    %sidx = arith.index_cast %s64 : i64 to index
    %large0 = arith.addi %c16, %sidx : index
    %large = arith.minsi %large0, %c31 : index
    %delta = arith.select %small, %n, %large : index
    %qk = ape.load %c2p[%b, %h, %i, %delta] : !ape.rows
    %kq = ape.load %p2c[%b, %h, %j, %delta] : !ape.rows
    %sum = arith.addf %qk, %kq : f32
    %dh = ape.dim "head_dim"
    %dh64 = arith.index_cast %dh : index to i64
    %dhf = arith.sitofp %dh64 : i64 to f32
    %root = math.sqrt %dhf : f32
    %term = arith.divf %sum, %root : f32
    %out = arith.addf %s, %term : f32
    ape.yield %out : f32
  }
}
