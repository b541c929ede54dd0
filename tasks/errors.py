"""Errors a user can act on in tasks/ (a bad dataset name, an unreadable file, a missing column)."""


class TaskError(Exception):
    """One clear sentence about a task set that cannot be built; the CLI prints it without a traceback."""

    user_facing = True
