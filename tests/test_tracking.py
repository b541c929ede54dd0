"""`--report-to`: a real `swarm train` writes its steps' figures to TensorBoard event files and an offline W&B run
under its output directory, read back here with each tool's own reader."""

import glob
import json
import struct

import pytest

from swarm.cli.main import main
from trainer.errors import TrainerError
from trainer.step_record import StepRecord
from trainer.tracking import gate_scalars, parse_report_to, step_scalars

FAST = {"task_config": "{max_value = 50}", "task_size": 80, "curriculum": '"none"', "lr": 1e-2, "grad_clip": 1.0,
        "max_new_tokens": 3, "prompts_per_step": 2, "group_size": 4, "steps_per_policy": 1, "eval_n": 4,
        "eval_every": 1, "threads": 1, "checkpoint_every": 100}


@pytest.fixture(autouse=True)
def _model_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path_factory.getbasetemp() / "model-cache"))


def _train(tmp_path, capsys, *report_to: str) -> tuple:
    config = tmp_path / "fast.toml"
    config.write_text("".join(f"{key} = {value}\n" for key, value in FAST.items()))
    out = tmp_path / "run"
    flags = [part for target in report_to for part in ("--report-to", target)]
    assert main(["train", "--model", "tiny", "--task", "gcd", "--config", str(config), "--steps", "2",
                 "--out", str(out), "--quiet", *flags]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return out, summary, log


def test_tensorboard_event_files_hold_every_step_and_the_heldout_curve(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, summary, log = _train(tmp_path, capsys, "tensorboard")
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/reward", "train/loss", "train/kl", "train/entropy", "train/groups_accepted",
                "train/groups_refused", "train/curriculum_stage", "perf/tokens_per_s", "perf/steps"):
        assert tag in tags
        assert [e.step for e in events.Scalars(tag)] == [1, 2]
    assert [e.value for e in events.Scalars("train/reward")] == pytest.approx([r["reward"] for r in log])
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([r["loss"] for r in log])
    heldout = events.Scalars("eval/heldout_accuracy")
    assert [e.step for e in heldout] == [0, 1, 2]  # before training, after step 1 (eval_every), after the last
    assert heldout[0].value == pytest.approx(summary["heldout_before"])
    assert heldout[-1].value == pytest.approx(summary["heldout_after"])
    assert not (out / "wandb").exists()


def test_wandb_offline_run_under_the_output_directory_holds_the_history(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default: no network, no login
    monkeypatch.setenv("WANDB_SILENT", "true")
    out, summary, log = _train(tmp_path, capsys, "wandb")
    runs = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1
    history = _wandb_history(runs[0])
    steps = {row["_step"]: row for row in history}
    assert [steps[s]["train/reward"] for s in (1, 2)] == pytest.approx([r["reward"] for r in log])
    assert [steps[s]["train/entropy"] for s in (1, 2)] == pytest.approx([r["entropy"] for r in log])
    assert steps[0]["eval/heldout_accuracy"] == pytest.approx(summary["heldout_before"])
    assert steps[2]["eval/heldout_accuracy"] == pytest.approx(summary["heldout_after"])
    assert not (out / "tensorboard").exists()


def test_report_to_is_checked_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--report-to", "tensorbord"]) == 2
    assert "unknown report_to target 'tensorbord'" in capsys.readouterr().err
    assert not out.exists()


def test_report_to_takes_repeats_commas_and_none():
    assert parse_report_to("tensorboard, wandb,tensorboard") == ("tensorboard", "wandb")
    assert parse_report_to(["wandb", "none,tensorboard"]) == ("wandb", "tensorboard")
    assert parse_report_to("none") == parse_report_to("") == ()
    with pytest.raises(TrainerError, match="'mlflow'"):
        parse_report_to(["tensorboard", "mlflow"])


def test_step_scalars_count_filtered_groups_and_the_swarm_gate():
    record = StepRecord(step=4, reward=0.5, groups=6, groups_trained=4, tokens=0, loss=float("nan"), entropy=0.0,
                        kl=None, clip_fraction=0.0, grad_norm=0.0, lr=1e-3, skipped="", old_logprobs="exact",
                        seconds=1.0, refused=1, stage_index=2, tokens_per_s=12.5)
    scalars = step_scalars(record)
    assert scalars["train/groups_filtered"] == 2 and scalars["perf/steps"] == 5
    assert scalars["train/curriculum_stage"] == 2 and scalars["train/loss"] != scalars["train/loss"]  # NaN kept
    assert "train/kl" not in scalars  # a figure the record lacks is not invented
    gate = gate_scalars({"accepted": 7, "rejected": 3, "refused:stale": 2, "refused:near-ties": 1, "vote:ok": 9})
    assert gate == {"swarm/groups_accepted": 7.0, "swarm/groups_rejected": 3.0, "swarm/groups_timed_out": 0.0,
                    "swarm/groups_refused": 3.0}


def _wandb_history(path: str) -> list[dict]:
    """The history rows of an offline W&B run file: a 7-byte header, then LevelDB-log records (32 KiB blocks; each
    chunk has crc32c, length and type 1 full / 2 first / 3 middle / 4 last) of wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    rows, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows
