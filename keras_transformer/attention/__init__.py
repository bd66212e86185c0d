"""Attention as something to look at: `maps` reads every attention weight matrix of a sentence pair, `plotting`
draws them (and the paper's two fixed curves)."""
