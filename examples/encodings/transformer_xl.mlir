// Transformer-XL relative terms, in the generic form:
//   l_ij += ((q_i + v)·P_r + u·k_j) / sqrt(d_h),  r = min(i - j, 256),
// with a relative table P [257, heads, head_dim] initialised to the sinusoid R_r (XL's W_R·R_{i-j}, here
// trained directly and clipped at 256 distances), the global biases u and v per head. (q_i + v)·P_r are
// query rows with bias v; u·k_j are key rows over a one-row table.
ape.encoding @transformer_xl {
  %p = ape.param "xl_rel" ["257", "heads", "head_dim"] init = "sinusoidal" trainable
  %v = ape.param "xl_v" ["heads", "head_dim"] init = "zeros" trainable
  %u = ape.param "xl_u" ["1", "heads", "head_dim"] init = "zeros" trainable
  %qp = ape.rel_rows "q" %p bias %v
  %uk = ape.rel_rows "k" %u
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c256 = arith.constant 256 : index
    %d = arith.subi %i, %j : index
    %n = arith.maxsi %d, %c0 : index
    %r = arith.minsi %n, %c256 : index
    %pos = ape.load %qp[%b, %h, %i, %r] : !ape.rows
    %glob = ape.load %uk[%b, %h, %j, %c0] : !ape.rows
    %sum = arith.addf %pos, %glob : f32
    %dh = ape.dim "head_dim"
    %dh64 = arith.index_cast %dh : index to i64
    %dhf = arith.sitofp %dh64 : i64 to f32
    %root = math.sqrt %dhf : f32
    %term = arith.divf %sum, %root : f32
    %out = arith.addf %s, %term : f32
    ape.yield %out : f32
  }
}
