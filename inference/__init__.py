"""inference: loading policy models, generation backends (torch on CPU, vLLM on GPU) with seeded Gumbel-max
sampling and TOPLOC proofs, in-place policy hot-swap, rollout building and solve-rate estimation.

Never imports p2p: it takes and returns plain data (token ids, tensors, bytes, verify.rollout objects). The package
itself imports nothing: importing one of its modules loads only what that module needs (inference.errors: no torch).
"""
