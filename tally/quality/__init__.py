"""`tally eval`: the quality gate. A candidate (quantized, or otherwise changed) model against its baseline
on held-out perplexity, task suites and a long-tail suite, with fixed greedy decoding."""
