// Dynamic NTK: the NTK base follows the current sequence length l = max(T, L) at run time,
// base' = base·((s·l/L) - (s-1))^(d_r/(d_r-2)); up to the original length L it is plain RoPE.
// T is the kernel's run-time length, so one compiled kernel serves every length.
ape.encoding @rope_dynamic_ntk {
  ape.rotary {scaling = "dynamic_ntk", factor = 4.0 : f64, original_length = 128}
}
