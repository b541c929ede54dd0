"""The FastCuRL schedule: stage boundaries, generation settings, TOML loading and its errors."""

import pytest

from trainer.curriculum import Curriculum, Stage, fastcurl, load_curriculum, no_curriculum
from trainer.errors import TrainerError


def test_fastcurl_follows_the_paper_shape_scaled_to_the_run():
    cur = fastcurl(total_steps=10, max_new_tokens=64, group_size=4)
    assert [(s.data, s.max_new_tokens, s.group_size) for s in cur.stages] == [
        ("short", 32, 4), ("all", 64, 4), ("long", 96, 4), ("all", 64, 8)]
    assert [s.steps for s in cur.stages] == [3, 3, 2, 2]
    assert cur.total_steps == 10


def test_stage_advances_by_step_and_the_last_stage_continues():
    cur = fastcurl(total_steps=8, max_new_tokens=64, group_size=4)
    indices = [cur.stage_at(step).index for step in range(12)]
    assert indices == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3]
    assert cur.stage_at(3).step_in_stage == 1
    assert cur.stage_at(11).step_in_stage == 5


def test_generation_settings_come_from_the_stage_in_force():
    cur = fastcurl(total_steps=8, max_new_tokens=64, group_size=4)
    gen = cur.generation_settings(5, temperature=0.6)
    assert gen == {"group_size": 4, "temperature": 0.6, "max_new_tokens": 96, "stage": "long@96",
                   "stage_index": 2, "data": "long"}


def test_none_is_a_single_stage():
    cur = no_curriculum(5, 32, 2)
    assert len(cur.stages) == 1 and cur.stage_at(100).stage.data == "all"


def test_toml_curriculum_loads(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[stage]]\ndata = "short"\nmax_new_tokens = 16\ngroup_size = 2\nsteps = 3\n'
                    '[[stage]]\nname = "wide"\ndata = "all"\nmax_new_tokens = 32\ngroup_size = 4\nsteps = 1\n')
    cur = load_curriculum(str(path), total_steps=99, max_new_tokens=1, group_size=1)
    assert cur == Curriculum("mine", (Stage("short@16", "short", 16, 2, 3), Stage("wide", "all", 32, 4, 1)))


@pytest.mark.parametrize(
    "body,needle",
    [
        (
            '[[stage]]\ndata = "all"\nmax_new_tokens = 8\ngroup_size = 2\nsteps = 1\ncontext = 3\n',
            "unknown key 'context'",
        ),
        ("[[stage]]\nmax_new_tokens = 8\ngroup_size = 2\nsteps = 1\n", "has no data"),
        ('[[stage]]\ndata = "medium"\nmax_new_tokens = 8\ngroup_size = 2\nsteps = 1\n', "choose from short, all, long"),
        ('title = "x"\n', "unknown key 'title'"),
        ('[[stage]]\ndata = "all"\ngroup_size = 2\nsteps = 1\n', "missing max_new_tokens"),
    ],
)
def test_bad_curricula_fail_with_one_clear_sentence(tmp_path, body, needle):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(TrainerError, match=needle) as info:
        load_curriculum(str(path), total_steps=4, max_new_tokens=8, group_size=2)
    assert "\n" not in str(info.value) and info.value.user_facing


def test_unknown_preset_is_rejected():
    with pytest.raises(TrainerError, match="neither a preset"):
        load_curriculum("fastcurl2", total_steps=4, max_new_tokens=8, group_size=2)
