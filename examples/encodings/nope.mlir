// NoPE: no positional encoding; the causal mask alone orders the tokens.
ape.encoding @nope {
}
