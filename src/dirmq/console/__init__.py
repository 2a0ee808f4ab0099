"""The web console of `dirmq serve` (issue 33): its pages and the samples behind its charts."""
