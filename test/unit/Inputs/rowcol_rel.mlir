// A row/column bias over relative rows (test spec): l_ij += (q'_i + v_h)·w_h + u_h·k'_j, the query
// side's term a row bias R(i) read from its relative rows, the key side's a column bias C(j). The
// flash kernels take it through their row/column table (rowcol_table_kernel), whose rows R(i) read
// the query side's rows, which a forward from first_row holds from its first computed row only
// (test/cuda/rowcol_rel_simt_test.cpp).
ape.encoding @rowcol_rel {
  %w = ape.param "rc_w" ["1", "heads", "head_dim"] init = "zeros" trainable
  %v = ape.param "rc_v" ["heads", "head_dim"] init = "zeros" trainable
  %u = ape.param "rc_u" ["1", "heads", "head_dim"] init = "zeros" trainable
  %qp = ape.rel_rows "q" %w bias %v
  %uk = ape.rel_rows "k" %u
  ape.score_mod {
  ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %pos = ape.load %qp[%b, %h, %i, %c0] : !ape.rows
    %glob = ape.load %uk[%b, %h, %j, %c0] : !ape.rows
    %a = arith.addf %s, %pos : f32
    %out = arith.addf %a, %glob : f32
    ape.yield %out : f32
  }
}
