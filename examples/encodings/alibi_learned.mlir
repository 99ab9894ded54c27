// ALiBi with learned slopes, initialised to the standard ones (including the rule for a head
// count that is not a power of two).
ape.encoding @alibi_learned {
  ape.alibi {learned}
}
