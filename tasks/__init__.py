"""tasks: the prompts a run trains on — built-in reasoning-gym tasks, user task files (JSONL, JSON, parquet, CSV)
and Hugging Face hub datasets from the local cache, with their columns mapped; chat-template rendering with one
answer format, FastCuRL length segments, held-out splits and offline difficulty filtering.

Never imports a model or p2p: the solve-rate estimator for difficulty filtering is injected by the caller.
"""

from tasks.difficulty import DifficultyBand, SolveRateCache, estimate_solve_rates, filter_by_solve_rate
from tasks.errors import TaskError
from tasks.loading import load_tasks
from tasks.prompts import ANSWER_INSTRUCTION, decode_completion, render_prompt_text, render_prompt_tokens
from tasks.segments import SEGMENTS, mean_prompt_length, segment
from tasks.taskset import TaskEntry, TaskSet

__all__ = [
    "ANSWER_INSTRUCTION",
    "DifficultyBand",
    "decode_completion",
    "SEGMENTS",
    "SolveRateCache",
    "TaskEntry",
    "TaskError",
    "TaskSet",
    "estimate_solve_rates",
    "filter_by_solve_rate",
    "load_tasks",
    "mean_prompt_length",
    "render_prompt_text",
    "render_prompt_tokens",
    "segment",
]
