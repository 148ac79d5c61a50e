"""Sparse autoencoders and transcoders on disk: :mod:`.read` (the three formats), :mod:`.names` (their hook
names as anatomy's hook points), :mod:`.labels` (Neuronpedia's exported explanations). No torch."""
