"""In-tree sandbox providers. Each depends on ``checkfu.contract`` only."""
