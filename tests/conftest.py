"""Fixtures shared by the model tests.

`one_torch_thread`: tiny matmuls run far faster on one intra-op thread than with two threads spin-waiting on a
shared 2-core machine; modules that run models opt in with `pytestmark = pytest.mark.usefixtures(...)`.
`tiny`: the offline tiny model, built once per module into a temporary cache.
`restore_logging` (every test): commands run in-process set logger levels (`swarm status` quiets p2p to errors);
each test starts from the levels the one before it found, so a log line one test asserts on is never filtered by
another test's command; likewise the name `swarm peer start` gives this process's lines (swarm.log_lines).
`pytest_configure`: a suite started in the background (`nohup`, `&`) inherits Ctrl-C ignored, and the peer
processes the tests start, then Ctrl-C'd by them, would keep it blocked (a background job's convention) and never
end; the suite takes SIGINT back first, as a foreground run has it.
"""

from __future__ import annotations

import logging
import signal

import pytest

from swarm.log_lines import line_name, set_line_name


def pytest_configure(config):
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def restore_logging():
    loggers = [logging.getLogger()] + [logger for logger in logging.root.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    saved = [(logger, logger.level, logger.disabled, list(logger.handlers)) for logger in loggers]
    name = line_name()
    yield
    set_line_name(name)
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
