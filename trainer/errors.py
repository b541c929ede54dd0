"""The trainer's user-facing error: one clear sentence, printed by the CLI on one line without a traceback."""


class TrainerError(Exception):
    """A problem with the trainer's input (config, curriculum, checkpoint, rollout) that the user can act on."""

    user_facing = True


class GeneratorDied(TrainerError):
    """The generator process failed or exited; the message says how (its error sentence or its exit code)."""
