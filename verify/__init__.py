"""verify: everything a validator decides, as plain data in and verdicts out (never imports p2p).

Modules (import the one you need; this package imports nothing heavy, so seed-only peers can use the schema):
  sampling     seeded Gumbel-max sampler shared by generators and validators
  rollout      RolloutGroup wire schema and bounds
  toploc       build_proof(s) / verify_proof(s): TOPLOC proofs, byte-identical to the reference toploc 0.1.6
  ndd          polynomial interpolation and evaluation modulo 65497, vectorised over chunks
  reward_fns   the reward functions (exact, numeric, math, rg:<dataset>, a run's own) and extract_answer
  reward_loading  a run's own reward (module:function or file.py:function, TRL's reward_funcs shape) and the
               BLAKE3 hash of its code that every peer compares
  rewards      compute_reward(reward_fn, text, entry) in [0, 1]: the slow ones in a scorer process (scorer_worker)
               under a deadline
  scorer_worker  the scorer process itself (`python -m verify.scorer_worker`)
  verdicts     CheckResult and Verdict: what the checks conclude, free of torch
  checks       pure checks (policy, the run's generation settings, assignment, rendering, length, stop tokens,
               termination, sampling, logprobs, reward, toploc)
  slots        SlotLedger: one rollout per slot (run, version, worker, step, task) for gates and validators
  verifier     verify_groups(models, groups, ctx): batched prefill + every check -> one Verdict per group
  provider     TaskSetProvider: the validator's view of the run's task sets and tokenizer
  votes        signed votes (Ed25519), rendezvous assignment of validators to rollout slots
  quorum       QuorumTracker: sans-IO accept/reject/timeout on virtual time
  reputation   worker and validator scores with sticky bans
  neartie      NearTies: one group's near-tie flips and their gaps, as the sampling check counts them
  worker_history  WorkerHistory: a sequential test on a worker's flips over all its groups; VoteEvidence sums
               them across validators from the votes
  model_inputs  token lists as model inputs, the same way for generator, verifier and trainer; length buckets
  testing      tiny models, a byte tokenizer and an honest reference generator for tests

The dishonest workers and the benchmark that measures these checks live in swarm/bench (attacks, verify,
verify_history, verify_crowd).
"""
