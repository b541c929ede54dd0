"""Fixtures shared by the model tests.

`one_torch_thread`: tiny matmuls run far faster on one intra-op thread than with two threads spin-waiting on a
shared 2-core machine; modules that run models opt in with `pytestmark = pytest.mark.usefixtures(...)`.
`tiny`: the offline tiny model, built once per module into a temporary cache.
`restore_logging` (every test): commands run in-process set logger levels (`swarm status` quiets p2p to errors);
each test starts from the levels the one before it found, so a log line one test asserts on is never filtered by
another test's command.
"""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def restore_logging():
    loggers = [logging.getLogger()] + [logger for logger in logging.root.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    saved = [(logger, logger.level, logger.disabled, list(logger.handlers)) for logger in loggers]
    yield
    known = {id(logger) for logger in loggers}
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and id(logger) not in known:
            logger.setLevel(logging.NOTSET)
    for logger, level, disabled, handlers in saved:
        logger.setLevel(level)
        logger.disabled = disabled
        logger.handlers[:] = handlers


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
