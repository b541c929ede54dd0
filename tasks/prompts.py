"""Rendering a task as model input: the question, an answer-format instruction, the model's chat template.

Why one instruction for every task: the reward extraction (`extract_answer` in verify/reward_fns.py) looks for the
text after "Answer:", so every prompt asks for exactly that; the policy learns one format across tasks.
"""

from __future__ import annotations

from tasks.taskset import TaskEntry

ANSWER_INSTRUCTION = "Give the final answer after 'Answer:'."


def render_prompt_text(entry: TaskEntry) -> str:
    """The user message: the question followed by the answer-format instruction."""
    return f"{entry.prompt.rstrip()}\n{ANSWER_INSTRUCTION}"


def render_prompt_tokens(tokenizer, entry: TaskEntry) -> list[int]:
    """Token ids of the chat-formatted prompt, ending where the assistant's reply begins.

    A tokenizer without a chat template (a base model) gets the plain text followed by a newline.
    """
    message = render_prompt_text(entry)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = message + "\n"
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode_completion(tokenizer, tokens) -> str:
    """The text a completion's reward is computed on: special tokens (EOS, chat markers) dropped.

    Workers and validators both call this, so a claimed reward and its recomputation read the same text.
    """
    return tokenizer.decode(list(tokens), skip_special_tokens=True)
