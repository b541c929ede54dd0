"""Errors a user can act on in inference/ (a model path that does not load, a policy that does not fit)."""


class InferenceError(Exception):
    """One clear sentence about a model or policy that cannot be used; printed by the CLI without a traceback."""

    user_facing = True
