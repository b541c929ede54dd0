"""The trainer config: TOML + overrides, type checks, unknown keys rejected in one line, inline [[stage]] tables."""

from pathlib import Path

import pytest

from trainer.config import TrainerConfig, load_config
from trainer.errors import TrainerError


def test_defaults_follow_intellect2_where_they_are_scale_free():
    cfg = load_config().config
    assert (cfg.weight_decay, cfg.beta1, cfg.beta2, cfg.grad_clip) == (0.01, 0.9, 0.99, 0.1)
    assert (cfg.clip_delta, cfg.eps_low, cfg.eps_high, cfg.entropy_coef, cfg.kl_coef) == (4.0, 0.2, 0.2, 0.001, 0.0)
    assert cfg.temperature == 0.6


def test_every_field_is_documented():
    for name, info in TrainerConfig.model_fields.items():
        assert info.description and len(info.description) > 10, f"{name} lacks a description"


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[trainer]\nlr = 1\nsteps = 6\nout = "x"\ncurriculum = "none"\n')
    loaded = load_config(path, {"steps": 9, "seed": None})
    assert loaded.config.lr == 1.0 and loaded.config.steps == 9 and loaded.config.out == Path("x")
    assert loaded.curriculum.name == "none" and loaded.curriculum.total_steps == 9


def test_inline_stages_define_the_curriculum(tmp_path):
    path = tmp_path / "staged.toml"
    path.write_text('steps = 3\n[[stage]]\ndata = "long"\nmax_new_tokens = 12\ngroup_size = 3\nsteps = 3\n')
    cur = load_config(path).curriculum
    assert cur.stage_at(0).stage.data == "long" and cur.stage_at(0).stage.group_size == 3


@pytest.mark.parametrize(
    "body,needle",
    [
        ("learning_rate = 0.1\n", "unknown config key 'trainer.learning_rate' in config file"),
        ('steps = "ten"\n', "config key trainer.steps in config file .* takes a whole number, got 'ten'"),
        ("group_size = 0\n", "group_size must be at least 1"),
        ("[trainer]\nlr = 0.1\n[other]\nx = 1\n", "unknown section 'other'"),
        ("lr = \n", "not valid TOML"),
        ("[trainerr]\nlr = 0.1\n", "unknown section 'trainerr'; did you mean \\[trainer\\]\\?"),
        ("[trainer]\nlr = 0.1\n[stagee]\nsteps = 1\n", "unknown section 'stagee' beside .*did you mean \\[stage\\]"),
        ("[trainer]\nlrr = 0.1\n", "unknown config key 'trainer.lrr' .*; did you mean 'trainer.lr'\\?"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path, body, needle):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(TrainerError, match=needle) as info:
        load_config(path)
    assert "\n" not in str(info.value).strip()


def test_generator_options_are_checked():
    cfg = load_config(overrides={"async_level": 2}).config
    assert (cfg.generator, cfg.generator_threads, cfg.threads, cfg.generator_own_session) == ("process", 1, 1, False)
    with pytest.raises(TrainerError, match="generator must be 'process' or 'thread'"):
        load_config(overrides={"generator": "fork"})
    with pytest.raises(TrainerError, match="generator_prefetch must be between 0 and the async level"):
        load_config(overrides={"async_level": 2, "generator_prefetch": 3})
    with pytest.raises(TrainerError, match="generator_threads must be at least 1"):
        load_config(overrides={"generator_threads": 0})


def test_the_device_is_checked_and_ddp_keeps_to_the_cpu(monkeypatch):
    import torch

    from inference.errors import InferenceError
    from trainer.launch import check_supported
    from trainer.session import train

    assert load_config().config.device == "auto"
    with pytest.raises(TrainerError, match="device must be auto, cpu or cuda"):
        load_config(overrides={"device": "tpu"})
    with pytest.raises(TrainerError, match="--device cuda does not apply to --nproc with ddp"):
        check_supported(load_config(overrides={"device": "cuda"}).config)
    check_supported(load_config(overrides={"device": "cuda", "parallel": "fsdp"}).config)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded = load_config(overrides={"device": "cuda"})
    with pytest.raises(InferenceError, match="device cuda was asked for"):  # before any model is loaded
        train(loaded.config, loaded.curriculum, echo=lambda line: None)
