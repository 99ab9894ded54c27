// ALiBi: a linear distance penalty -m_h·(i - j) with the standard per-head slopes.
ape.encoding @alibi {
  ape.alibi
}
