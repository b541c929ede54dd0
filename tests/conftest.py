"""Fixtures shared by the model tests.

`one_torch_thread`: tiny matmuls run far faster on one intra-op thread than with two threads spin-waiting on a
shared 2-core machine; modules that run models opt in with `pytestmark = pytest.mark.usefixtures(...)`.
`tiny`: the offline tiny model, built once per module into a temporary cache.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from inference.models import load_model

    return load_model("tiny", cache_dir=tmp_path_factory.mktemp("models"))
