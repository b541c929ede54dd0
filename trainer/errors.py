"""The trainer's user-facing error: one clear sentence, printed by the CLI on one line without a traceback."""


class TrainerError(Exception):
    """A problem with the trainer's input (config, curriculum, checkpoint, rollout) that the user can act on."""

    user_facing = True
