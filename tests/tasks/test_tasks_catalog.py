"""`swarm tasks`: the built-in tasks with a one-line description and the difficulty settings a run gets."""

from __future__ import annotations

import json

from swarm.cli.main import main


def test_swarm_tasks_lists_each_builtin_task_with_the_settings_a_run_gets(capsys):
    from reasoning_gym.factory import DATASETS

    assert main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"{len(DATASETS)} built-in task(s); set difficulty with task_config")
    pairs = [(lines[i], lines[i + 1]) for i in range(0, len(lines) - 1, 2)]  # name + description, settings
    by_name = {title.split()[0]: (title, settings) for title, settings in pairs}
    assert sorted(by_name) == sorted(DATASETS)
    description, settings = by_name["basic_arithmetic"]
    assert "basic arithmetic tasks" in description
    # the project's preset (up to 3 terms of up to 2 digits) over reasoning-gym's defaults (6 terms, 4 digits)
    assert "min_terms=2 max_terms=3 min_digits=1 max_digits=2" in settings and "seed=" not in settings


def test_swarm_tasks_json_and_named_tasks(capsys):
    assert main(["tasks", "gcd", "countdown", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["tasks"]
    assert [t["name"] for t in listed] == ["gcd", "countdown"]
    assert listed[0]["settings"] == {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 1000}
    assert listed[1]["settings"]["operators"] == ["+", "-", "*", "/"] and listed[1]["description"]


def test_an_unknown_task_name_is_one_sentence_with_the_nearest_names(capsys):
    assert main(["tasks", "gcdd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "swarm: error: 'gcdd' is not a built-in task (did you mean gcd?); `swarm tasks` lists them all"


def test_a_task_name_no_source_knows_is_one_sentence_naming_every_kind_of_source(capsys):
    assert main(["eval", "--task", "gcdd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("swarm: error: unknown task 'gcdd': not a reasoning-gym dataset (did you mean gcd? `swarm tasks` "
                   "lists them), a task file (.jsonl, .json, .parquet, .csv) nor a hub dataset (ORG/NAME)")


def test_every_task_has_a_description_of_its_own_never_a_dataclass_signature(capsys):
    assert main(["tasks", "--json"]) == 0
    listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tasks"]}
    number_format = listed["number_format"]["description"]
    assert number_format == "Choose largest number out of several represented in various formats"
    assert listed["string_manipulation"]["description"] != listed["string_insertion"]["description"]
    for task in listed.values():
        assert task["description"] and "Config(" not in task["description"], task["name"]
        assert "Options(" not in json.dumps(task["settings"]), task["name"]  # a nested default as its fields
