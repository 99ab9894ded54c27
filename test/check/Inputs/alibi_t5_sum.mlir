// Learned ALiBi and T5 in one encoding: the fused score mod is (s + slope (j - i)) + table[bucket],
// a sum of distance terms that the emitter turns into one distance bias (kDistanceBias).
ape.encoding @alibi_t5_sum {
  ape.alibi {learned}
  ape.t5_bias {buckets = 32, max_distance = 128}
}
