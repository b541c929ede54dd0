"""Data parallelism with gloo on the CPU: two ranks, plain all-reduce (ddp) and sharded (fsdp), equal to one process.

One pair of rank processes runs both modes (process start-up dominates the cost): two GRPO steps on its share of a
fixed batch with all-reduce, then the same two steps with the model sharded by FSDP2, then an FSDP checkpoint that
a freshly sharded model resumes from. The test process trains on the whole batch meanwhile and compares.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainer.distributed import default_backend, init_data_parallel, init_parallel, shard
from trainer.errors import TrainerError
from trainer.fsdp import FsdpPrecision, default_precision, shard_plan

LAUNCH = (
    "import sys; sys.path.insert(0, sys.argv[2]); from test_trainer_distributed import run_rank; run_rank(sys.argv[1])"
)
CONFIG = dict(lr=1e-2, warmup_steps=1, micro_batch=3, grad_clip=1.0)


def batches():
    """Two steps of five informative groups (the ranks get 3 and 2: unequal micro-batch counts under FSDP)."""
    from trainer.step import TrainGroup

    out = []
    for step in range(2):
        groups = []
        for g in range(5):
            comps = tuple(tuple(5 + (7 * step + 11 * g + 13 * c + 3 * t) % 50 for t in range(2 + (g + c) % 4))
                          for c in range(3))
            rewards = tuple(float((step + g + c) % 2) for c in range(3))
            groups.append(TrainGroup(f"{step}-{g}", 0, (10 + g, 11, 12), comps, rewards, 1.0, 6))
        out.append(groups)
    return out


def train(trainer, rank: int, world: int) -> list[list[float]]:
    """Two steps on this rank's share; per step [this rank's loss, global gradient norm before clipping]."""
    figures = []
    for step, groups in enumerate(batches()):
        report = trainer.train_step(step, shard(groups, rank, world))
        assert not report.skipped, report
        figures.append([report.loss, report.grad_norm])
    return figures


def tied_model():
    """The tiny architecture with a tied LM head, as SmolLM2 has: the head and the embeddings are one matrix."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from inference.tiny import ARCH, VOCAB_SIZE

    with torch.random.fork_rng():
        torch.manual_seed(7)
        return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB_SIZE, **{**ARCH, "tie_word_embeddings": True}))


def close_weights(a: dict, b: dict, atol: float = 1e-4) -> bool:
    """Every tensor of `b` matches `a` within a hundredth of one Adam step (lr 1e-2), except attention key biases:
    softmax ignores a shift that is the same for all keys of a query, so their gradient is zero in exact arithmetic
    and pure float noise here, which Adam turns into lr-sized steps whose sign depends on the order of summation
    (one process vs two ranks). Elsewhere the same noise moves the odd element of a tiny gradient by up to ~2e-5 (the
    ranks run their micro-batches, sorted by length, in another order than one process); a sharding or tying bug
    moves whole tensors by lr-sized amounts."""
    return all(torch.allclose(a[k], b[k], atol=atol) for k in b if not k.endswith("k_proj.bias"))


def plain_weights(model) -> dict:
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def run_rank(out: str) -> None:
    """One rank: ddp training, fsdp training + published policy, fsdp checkpoint + resume; results under `out`."""
    from inference.models import load_model
    from trainer.checkpoint import TrainerState, load_checkpoint, publish_policy, save_checkpoint
    from trainer.config import load_config
    from trainer.fsdp import apply_fsdp, empty_checkpoint, full_state_dict, gather_checkpoint, unsharded_copy
    from trainer.fsdp_step import FsdpPolicyTrainer
    from trainer.step import PolicyTrainer

    torch.set_num_threads(1)
    out, cfg = Path(out), load_config(overrides=CONFIG).config
    ddp = init_parallel("ddp", "gloo")
    rank, world = ddp.rank, ddp.world_size
    loaded = load_model("tiny")
    trainer = PolicyTrainer(loaded.model, cfg, pad_id=0, collective=ddp)
    trainer.mark_published(0)
    figures = {"ddp": train(trainer, rank, world)}
    save_file(plain_weights(loaded.model), str(out / f"ddp{rank}.st"))

    fsdp = init_parallel("fsdp")
    loaded = load_model("tiny")
    sharded = FsdpPolicyTrainer(apply_fsdp(loaded.model), cfg, pad_id=0, collective=fsdp)
    sharded.mark_published(0)
    figures["fsdp"] = train(sharded, rank, world)
    tied = FsdpPolicyTrainer(apply_fsdp(tied_model()), cfg, pad_id=0, collective=fsdp)
    tied.mark_published(0)
    figures["tied"] = train(tied, rank, world)
    save_file(full_state_dict(tied.model), str(out / f"tied{rank}.st"))
    (out / f"figures{rank}.json").write_text(json.dumps(figures))
    local = {k: v.to_local().numel() for k, v in loaded.model.state_dict().items()}
    (out / f"local{rank}.json").write_text(json.dumps(local))
    policy = unsharded_copy(loaded.model)  # every rank gathers; rank 0 writes
    view = gather_checkpoint(loaded.model, sharded.optimizer)
    if rank == 0:
        publish_policy(out / "fsdp-policy", policy, loaded.tokenizer, {}, {})
        save_checkpoint(out / "ckpt", view.model, view.optimizer, sharded.scheduler, TrainerState(step=2))
    torch.distributed.barrier()

    fresh = load_model("tiny")
    resumed = FsdpPolicyTrainer(apply_fsdp(fresh.model), cfg, pad_id=0, collective=fsdp)
    loading = empty_checkpoint(fresh.model)
    state = load_checkpoint(out / "ckpt" / "step-000002", loading.model, loading.optimizer, resumed.scheduler)
    loading.scatter_into(fresh.model, resumed.optimizer)
    again = gather_checkpoint(fresh.model, resumed.optimizer)
    moments = {f"{k}.{m}": v[m] for k, v in again.optimizer.state["state"].items() for m in ("exp_avg", "exp_avg_sq")}
    save_file({**{f"w.{k}": v for k, v in full_state_dict(fresh.model).items()}, **moments},
              str(out / f"resumed{rank}.st"))
    (out / f"resumed{rank}.json").write_text(json.dumps({"step": state.step, "lr": resumed.scheduler.get_last_lr()}))
    torch.distributed.destroy_process_group()


_PORTS_GIVEN: set[int] = set()


def _free_port() -> int:
    """A port free now and not given before: two groups start together, before either binds its port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def _start_ranks(code: str, *args: str, **env: str) -> list[subprocess.Popen]:
    """Two rank processes running `code` with torch.distributed's environment (RANK 0 and 1, a free port)."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), **env}
    return [subprocess.Popen([sys.executable, "-c", code, *args], env={**env, "RANK": str(rank)},
                             stderr=subprocess.PIPE, text=True) for rank in range(2)]


def _finish_ranks(ranks: list[subprocess.Popen], timeout: float) -> None:
    for proc in ranks:
        assert proc.wait(timeout=timeout) == 0, proc.stderr.read()[-3000:]


@pytest.fixture(scope="module")
def ending_ranks(tmp_path_factory):
    """Two ranks that join a group, import what loading a model imports, end the group and list their threads
    (ENDED); started, not awaited, so that they run beside `runs`, which asks for them first and is mostly its
    own processes' start-up."""
    out = tmp_path_factory.mktemp("ending")
    ranks = _start_ranks(ENDED, str(out), str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    yield out, ranks
    for proc in ranks:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ending_ranks):
    """Launch the two ranks, train on the whole batch in this process meanwhile, wait for the ranks."""
    from inference.models import load_model
    from trainer.checkpoint import publish_policy
    from trainer.config import load_config
    from trainer.step import PolicyTrainer

    out = tmp_path_factory.mktemp("dist")
    mp = pytest.MonkeyPatch()
    mp.setenv("SWARM_MODEL_CACHE", str(out / "cache"))
    initial = load_model("tiny")  # builds the cache the ranks share
    ranks = _start_ranks(LAUNCH, str(out), str(Path(__file__).parent))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load_model("tiny")
        trainer = PolicyTrainer(loaded.model, load_config(overrides=CONFIG).config, pad_id=0)
        trainer.mark_published(0)
        trainer.figures = train(trainer, 0, 1)
        tied = PolicyTrainer(tied_model(), load_config(overrides=CONFIG).config, pad_id=0)
        tied.mark_published(0)
        trainer.tied_figures = train(tied, 0, 1)
        trainer.tied_weights = plain_weights(tied.model)
        publish_policy(out / "single-policy", loaded.model, loaded.tokenizer, {}, {})
        _finish_ranks(ranks, timeout=240)
    finally:
        torch.set_num_threads(threads)
        for proc in ranks:
            proc.kill()
        mp.undo()
    return out, plain_weights(initial.model), plain_weights(loaded.model), trainer


def test_two_ddp_ranks_match_one_process_on_the_full_batch(runs):
    out, initial, single, _ = runs
    r0, r1 = load_file(str(out / "ddp0.st")), load_file(str(out / "ddp1.st"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # the ranks never diverge
    assert close_weights(r0, single)  # summed shards == the whole batch
    assert not torch.allclose(r0["model.norm.weight"], initial["model.norm.weight"])  # and training moved them


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "tied"])
def test_ranks_losses_add_up_and_gradient_norms_equal_one_process(runs, mode):
    """Adam's step barely depends on the gradient scale, so weights alone would not catch a mean-for-sum bug."""
    out, _, _, trainer = runs
    ranks = [json.loads((out / f"figures{r}.json").read_text())[mode] for r in range(2)]
    for step, (loss, norm) in enumerate(trainer.tied_figures if mode == "tied" else trainer.figures):
        assert ranks[0][step][0] + ranks[1][step][0] == pytest.approx(loss, rel=1e-5, abs=1e-7)
        assert ranks[0][step][1] == ranks[1][step][1] == pytest.approx(norm, rel=1e-5)


def test_fsdp_gathered_weights_match_one_process_and_ddp(runs):
    out, initial, single, _ = runs
    from inference.models import load_model

    policy = load_model(str(out / "fsdp-policy")).model  # the published policy loads like any other
    gathered, ddp = plain_weights(policy), load_file(str(out / "ddp0.st"))
    assert set(gathered) == set(single)
    assert close_weights(gathered, single)
    assert close_weights(gathered, ddp)
    moved = [k for k in single if not torch.allclose(single[k], initial[k], atol=1e-4)]
    assert len(moved) > len(single) // 2  # two real steps moved most tensors, so the match is not vacuous


def test_fsdp_trains_a_tied_head_as_one_matrix_like_one_process(runs):
    out, _, _, trainer = runs
    single = trainer.tied_weights
    for rank in range(2):
        gathered = load_file(str(out / f"tied{rank}.st"))
        assert torch.equal(gathered["lm_head.weight"], gathered["model.embed_tokens.weight"])
        assert close_weights(gathered, single)


def test_fsdp_really_shards_every_tensor(runs):
    out, _, single, _ = runs
    local = [json.loads((out / f"local{r}.json").read_text()) for r in range(2)]
    assert set(local[0]) == set(single)
    for name, tensor in single.items():  # dim 0 split across the two ranks (an odd row count goes to rank 0)
        assert local[0][name] + local[1][name] == tensor.numel() and local[1][name] <= tensor.numel() // 2


def test_fsdp_policy_files_are_what_one_process_publishes(runs):
    out = runs[0]
    assert (out / "fsdp-policy" / "config.json").read_bytes() == (out / "single-policy" / "config.json").read_bytes()
    headers = []
    for name in ("fsdp-policy", "single-policy"):
        with safe_open(str(out / name / "model.safetensors"), "pt") as f:
            headers.append({k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()})
    assert headers[0] == headers[1]


def test_fsdp_checkpoint_resumes_the_exact_weights_and_adam_state(runs):
    out, _, single, trainer = runs
    for rank in range(2):
        resumed = load_file(str(out / f"resumed{rank}.st"))
        assert close_weights({k: resumed[f"w.{k}"] for k in single}, single)
        names = dict(trainer.model.named_parameters())
        for k, p in names.items():  # the FSDP optimizer state, gathered after resume, is the single process's
            adam = trainer.optimizer.state[p]
            assert torch.allclose(resumed[f"{k}.exp_avg"], adam["exp_avg"], atol=1e-6)
            assert torch.allclose(resumed[f"{k}.exp_avg_sq"], adam["exp_avg_sq"], atol=1e-8)
        meta = json.loads((out / f"resumed{rank}.json").read_text())
        assert meta["step"] == 2 and meta["lr"] == trainer.scheduler.get_last_lr()


def test_shard_plan_groups_blocks_then_embeddings_with_head_then_root(tiny):
    assert shard_plan(tiny.model) == [("model.layers.0",), ("model.layers.1",), ("model", "lm_head"), ("",)]


def test_precision_defaults_and_validation():
    assert default_precision("cuda") == FsdpPrecision("bfloat16", "float32")
    assert default_precision("cpu") == FsdpPrecision("float32", "float32")
    with pytest.raises(TrainerError, match="param_dtype must be one of"):
        FsdpPrecision("float16").validate()


def test_shard_splits_round_robin():
    assert shard(list(range(7)), 1, 3) == [1, 4]
    assert sorted(shard(list(range(7)), 0, 2) + shard(list(range(7)), 1, 2)) == list(range(7))


def test_guards_name_the_missing_piece(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TrainerError, match="nccl backend needs CUDA"):
        init_data_parallel("nccl")
    with pytest.raises(TrainerError, match="unknown distributed backend"):
        init_data_parallel("mpi")
    with pytest.raises(TrainerError, match="unknown parallel mode"):
        init_parallel("zero3")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(TrainerError, match="needs RANK in the environment"):
        init_data_parallel()  # the automatic backend (gloo here) still needs torchrun's environment


def test_ddp_stays_on_gloo_even_beside_gpus(monkeypatch):
    """ddp keeps the model on the CPU (shared with the torch generator): NCCL cannot reduce it, so a GPU machine
    still gets gloo for ddp, and nccl for FSDP, whose shards live on the GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_backend("ddp") == "gloo" and default_backend("fsdp") == "nccl"
    with pytest.raises(TrainerError, match="ddp keeps the model on the CPU, which nccl cannot reduce"):
        init_data_parallel("nccl", "ddp")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_backend("fsdp") == "gloo"


ENDED = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from trainer.distributed import end_data_parallel, init_data_parallel
collective = init_data_parallel("gloo")
import transformers.modeling_utils  # what loading a model imports, once the group has started
collective.all_sum(1.0)
end_data_parallel()
names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
open(os.path.join(sys.argv[1], f"threads{os.environ['RANK']}.json"), "w").write(json.dumps(names))
"""


def test_ending_the_group_ends_its_gloo_threads_even_after_model_imports(ending_ranks):
    """A rank that loaded a model after joining still ends its group for real: no gloo thread is left to be torn
    down during interpreter shutdown, where that can abort ranks of finished runs."""
    out, ranks = ending_ranks
    _finish_ranks(ranks, timeout=120)
    for rank in range(2):
        names = json.loads((out / f"threads{rank}.json").read_text())
        assert names and not [name for name in names if "gloo" in name], names
