"""The parallel layers: one file per tensor mode (serial, one_d, two_d, two_half_d, three_d) and the autograd
pieces they share (functional, shards, tokens, kept weights, dropout, RMSNorm / llama)."""
