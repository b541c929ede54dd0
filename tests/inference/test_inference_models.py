"""inference.models: the offline tiny model, local-directory loading and one-sentence load errors."""

import json

import pytest
import torch

from inference.errors import InferenceError
from inference.models import load_model
from tasks import load_tasks, render_prompt_tokens


def test_tiny_is_the_same_model_on_every_build(tmp_path, tiny):
    other = load_model("tiny", cache_dir=tmp_path)
    for (name, a), (_, b) in zip(tiny.model.state_dict().items(), other.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert tiny.description["tokenizer_id"] == other.description["tokenizer_id"]
    assert tiny.model_id.startswith("tiny@") and tiny.description["architecture"]["model_type"] == "qwen2"


def test_tiny_chat_template_and_eos(tiny):
    entry = load_tasks("chain_sum", size=1, seed=0)[0]
    ids = render_prompt_tokens(tiny.tokenizer, entry)
    text = tiny.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\n" + entry.prompt) and text.endswith("<|im_start|>assistant\n")
    assert "Answer:" in text
    assert tiny.eos_token_ids == (tiny.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert tiny.tokenizer.decode(tiny.tokenizer("12 + 7 = 19")["input_ids"]) == "12 + 7 = 19"


def test_a_trainer_written_directory_loads_with_its_description(tmp_path, tiny):
    directory = tmp_path / "policy-3"
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    (directory / "model.json").write_text(json.dumps({"name": "tiny", "tokenizer_id": "abc123", "architecture": {}}))
    loaded = load_model(str(directory))
    assert loaded.description["name"] == "tiny" and loaded.description["tokenizer_id"] == "abc123"
    assert torch.equal(loaded.model.lm_head.weight, tiny.model.lm_head.weight)


def test_paths_that_do_not_load_are_one_clear_error(tmp_path):
    with pytest.raises(InferenceError, match=r"neither built in \(tiny, tiny-sum, smollm2\), an existing directory"):
        load_model(str(tmp_path / "nope"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(InferenceError, match=r"model directory .*broken does not load"):
        load_model(str(broken))


def test_the_package_and_its_errors_import_without_torch():
    import subprocess
    import sys

    code = "import sys, inference, inference.errors; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
