"""The "tiny" model: a random-init Qwen2 with one built-in prior (an answer ends after its number) and a locally
trained byte-level BPE tokenizer, fully offline.

Why: tests, simulations and benchmarks need a real transformers causal LM (same code paths as a real policy:
chat template, KV cache, hidden states, safetensors weights) that builds in a fraction of a second with no
download. Everything is a pure function of the constants below, so every peer builds bit-identical weights.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TINY_VERSION = "tiny-v3"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB_SIZE = 384
ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
INIT_SEED = 1234
LM_HEAD_STD = 0.25
NUMBER_FEATURE = 1.0  # norm of the direction added to every number token's embedding (the others: about 0.16)
END_AFTER_NUMBER = 1.4  # scale of that direction in <|im_end|>'s head row: P(end | a number just emitted) ~ 0.8

_PHRASES = [
    "Calculate",
    "State the final answer to the following arithmetic problem:",
    "Give the final answer after 'Answer:'.",
    "Answer:",
    "Find a way to make",
    "using all of these numbers:",
    "Each number may be used at most once.",
    "Final answer format instructions:",
    "Provide your solution as a arithmetic expression (no '=' sign).",
    "What is",
    "The answer is",
    "user",
    "assistant",
    "system",
]


def training_corpus(lines: int = 600) -> list[str]:
    """Deterministic text the tokenizer learns from: task phrasing plus arithmetic expressions."""
    rng = random.Random(0)
    corpus = list(_PHRASES) + ["0123456789 + - * / ( ) = ."]
    for _ in range(lines):
        terms = [str(rng.randint(-99, 999)) for _ in range(rng.randint(2, 5))]
        expr = f" {rng.choice('+-*/')} ".join(terms)
        corpus.append(f"{rng.choice(_PHRASES)} {expr} = ? Answer: {rng.randint(-999, 9999)}")
    return corpus


def build_tokenizer():
    """A byte-level BPE tokenizer (any text encodes) with ChatML special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(training_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def build_tiny(directory: Path) -> None:
    """Write the tiny model (safetensors + config + tokenizer) into `directory`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=pad, bos_token_id=None, **ARCH)
    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        model = Qwen2ForCausalLM(config)
        # Random init at std 0.02 gives near-uniform logits (every completion is noise at any temperature);
        # an untied head at std 0.25 gives logits of std about 2, so sampling and greedy decoding differ.
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, LM_HEAD_STD)
            _end_answers_after_their_number(model, tokenizer, eos)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def _end_answers_after_their_number(model, tokenizer, eos: int) -> None:
    """Give the random model one prior a pretrained model has: an answer ends after its number.

    Why: at random init <|im_end|> is one token in 384, so sampled completions almost never stop; the policy
    learned a number followed by junk to the length limit, and whether greedy evaluation read the right answer
    depended on whether that junk held digits (held-out accuracy 0 in some runs, about 0.2 in others). A shared
    direction in every number token's embedding (it dominates the residual stream of a 2-layer model at random
    init) that <|im_end|>'s head row reads makes ending likely right after a number and nowhere else, so the
    reward teaches which number to answer, and greedy decoding stops where sampling does. The direction comes from
    its own seeded generator in float64, so every peer still builds bit-identical weights."""
    direction = torch.randn(ARCH["hidden_size"], generator=torch.Generator().manual_seed(INIT_SEED + 1),
                            dtype=torch.float64)
    direction = direction / direction.norm()
    numbers = sorted(i for token, i in tokenizer.get_vocab().items() if _is_number_token(token))
    model.model.embed_tokens.weight[numbers] += (NUMBER_FEATURE * direction).float()
    model.lm_head.weight[eos] = (END_AFTER_NUMBER * direction).float()


def _is_number_token(token: str) -> bool:
    """A byte-level BPE token that is digits, with or without its leading space marker."""
    digits = token.removeprefix("\u0120")
    return digits.isascii() and digits.isdigit()
