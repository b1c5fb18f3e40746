"""Family ``collab``: a small and a large model (or a diffusion and a causal model) writing one
output together — entropy-adaptive hand-over, speculative cascades, diffusion drafts."""
