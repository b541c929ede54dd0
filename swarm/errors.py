"""Errors a user can act on.

Convention across packages (p2p, verify, inference, trainer, tasks each keep their own error class so that they
never import `swarm`): an exception class with `user_facing = True` carries one clear sentence naming the problem.
The CLI prints it on one line and exits with status 2; any other exception is a bug and keeps its traceback.
"""

from pathlib import Path


class UserError(Exception):
    """A problem with the user's input or environment, reported as one sentence."""

    user_facing = True


def usable_directory(path: Path, what: str) -> Path:
    """Create directory `path` (and its parents) if needed; one sentence naming `what` it is for when it is a file
    or cannot be created (a bare FileExistsError traceback before)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{what} {path} exists and is not a directory") from None
    except OSError as exc:
        raise UserError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    return path


def require_temperature(value: float) -> None:
    """Refuse a sampling temperature outside 0..10 (the range every generation request accepts; 0 = greedy)."""
    if not 0.0 <= value <= 10.0:
        raise UserError(f"--temperature must be within 0..10 (0 = greedy), got {value}")


def require_at_least_one(**flags: int | float) -> None:
    """Refuse, in one sentence naming it, the first command-line count below 1 (flags given by their dest names)."""
    for name, value in flags.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
