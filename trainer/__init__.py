"""trainer: GRPO with INTELLECT-2's recipe on a FastCuRL curriculum; checkpoints; publishing policy versions.

Map (each module holds one idea):
  grpo.py         pure loss math: group advantages, two-sided clip, constant normaliser, k3 KL, entropy, filters
  loss_config.py  LossConfig, the loss's hyper-parameters (no torch: the config builds it)
  curriculum.py   FastCuRL stages as data; stage_at(step) fixes the generation settings of each published policy
  config.py       TrainerConfig (TOML + flags, every field documented)
  step.py         PolicyTrainer: one optimizer step; old logprobs from the generating version (importance weights),
                  taken from the training forward itself when every row is on-policy
  admission.py    which rollout groups the trainer accepts (run, known version, async window, its version's
                  generation settings, slot not yet trained on)
  checkpoint.py   atomic full checkpoints (exact resume) and publish_policy (a loadable version directory)
  loop.py         TrainingRun.step(groups) + run_sync / run_async_process (the generator in its own process) /
                  run_async (a worker thread); wants_step() applies the step count and the wall-time budget
  generator_process.py  the spawned generator process: policies in, rollout groups out, bounded and always reaped
  local_source.py the inference role in-process, following published policy files like a swarm worker
  evaluate.py     greedy held-out accuracy;  session.py: a whole `swarm train` session;  report.py: log + plot
  session_setup.py  seeding and the train/held-out split, shared by a session and its generator process
  distributed.py  data parallelism over torch.distributed (gloo tested; nccl guarded); init_parallel("ddp"|"fsdp")
  collectives.py  the step's collectives: gradients all-reduced (ddp), or already reduced by FSDP
  fsdp.py         FSDP2 sharding plan, precision and gathering full weights for policies and checkpoints
  fsdp_step.py    the GRPO step over a sharded model, every rank in lockstep (tested on two gloo ranks)

Never imports p2p: the swarm hands the trainer plain RolloutGroups and takes published directories back.
Import the module you need: this package imports nothing, so `trainer.config` loads without torch.
"""
