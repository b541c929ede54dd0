"""`swarm train` on a reused --out: a damaged newest checkpoint is skipped by name, another run is refused in one
line with status 2, and -v adds each step's figures and each checkpoint written."""

import pytest

from swarm.cli.main import main


@pytest.fixture(autouse=True)
def _model_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path_factory.getbasetemp() / "model-cache"))


def _train(out, *flags):
    return main(["train", "--model", "tiny", "--task", "gcd", "--out", str(out), "--generator", "thread",
                 "--max-new-tokens", "2", "--group-size", "4", "--prompts-per-step", "2", "--eval-n", "4",
                 "--set", "trainer.task_size=40", "--set", "trainer.checkpoint_every=1", "--set",
                 "trainer.task_config={max_value = 20}", *flags])


def test_a_damaged_newest_checkpoint_is_skipped_by_name_and_another_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "--steps", "2", "--keep-last", "3", "-v") == 0
    first = capsys.readouterr().err
    assert "info trainer.session: step 1: {" in first and "info trainer.checkpoint: checkpoint " in first
    damaged = out / "checkpoints" / "step-000002" / "model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])
    assert _train(out, "--steps", "3") == 0
    err = capsys.readouterr().err
    assert f"skipped checkpoint {out / 'checkpoints' / 'step-000002'}: {damaged} does not match its hash" in err
    assert f"resuming {out} from step 1 " in err and "Traceback" not in err
    assert _train(out, "--steps", "4", "--task", "lcm") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == (f"swarm: error: {out} holds another run: task 'gcd' (now 'lcm'); give another --out (a "
                         "trainer peer: --data-dir), or --resume (a trainer peer: resume = true in its "
                         "--trainer-config) to continue that run with these settings")
