"""A tiny causal language model and tokenizer built on the spot (nothing from a hub).

The tokenizer is a byte-level BPE trained on the conversations the test will render,
with Qwen 2.5's chat template (TRL ships it and knows how to parse its tool calls).
The model is a two-layer Qwen2 from a config. :func:`warm_up` teaches it, in a few
dozen steps of plain supervised training, the one conversation the trainer will run:
call the tool, then answer. That is what makes the sampled completions really call
the tool under GRPO (a random model would almost never emit a well-formed call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    qwen2_5_chat_template,
)

__all__ = ["build_model", "build_tokenizer", "conversation", "warm_up"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def conversation(prompt: str, tool: str, message: str, answer: str) -> list[dict[str, Any]]:
    """The conversation the model is taught: one tool call, its result, an answer."""
    call = {"type": "function", "function": {"name": tool, "arguments": {"message": message}}}
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": tool, "content": message},
        {"role": "assistant", "content": answer},
    ]


def build_tokenizer(corpus_conversations: Sequence[list[dict[str, Any]]],
                    tools: Sequence[Callable[..., Any]]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the rendered conversations."""

    def wrap(core: Tokenizer) -> PreTrainedTokenizerFast:
        tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>", bos_token=None)
        tok.chat_template = qwen2_5_chat_template
        return tok

    def train(texts: Sequence[str]) -> Tokenizer:
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        core.train_from_iterator(texts, trainer=trainer)
        return core

    # First pass: any byte-level tokenizer renders the template; the second is trained
    # on what the template really produces, so the prompts stay short.
    first = wrap(train(["hello world"]))
    texts = [first.apply_chat_template(c, tools=list(tools), tokenize=False)
             for c in corpus_conversations]
    tok = wrap(train(texts * 4))
    # What GRPOTrainer would do itself, done first so that the warm-up renders the very
    # prompts the trainer will: the tool-call parser of this template, and TRL's
    # prefix-preserving training variant of it for multi-turn rollouts.
    add_response_schema(tok)
    if not is_chat_template_prefix_preserving(tok):
        tok.chat_template = get_training_chat_template(tok)
    return tok


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A two-layer Qwen2 with random weights, sized for the tokenizer."""
    # One thread: a model this small gains nothing from more, and on a busy machine
    # several threads per process spin against each other (tens of times slower).
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def warm_up(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
            conversations: Sequence[list[dict[str, Any]]],
            tools: Sequence[Callable[..., Any]], *, steps: int = 120) -> float:
    """Supervised steps on the assistant turns of ``conversations``; returns the worst
    turn's loss at the last step."""
    batches = []
    for conv in conversations:
        ids: list[int] = []
        labels: list[int] = []
        # Each assistant turn is learnt given everything before it.
        for i, message in enumerate(conv):
            if message["role"] != "assistant":
                continue
            prefix = tokenizer.apply_chat_template(conv[:i], tools=list(tools),
                                                   add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
            full = tokenizer.apply_chat_template(conv[:i + 1], tools=list(tools),
                                                 tokenize=True, return_dict=False)
            # The template ends a turn with "<|im_end|>\n": learn up to the end token.
            end = full.index(tokenizer.eos_token_id, len(prefix)) + 1
            ids, labels = full[:end], [-100] * len(prefix) + full[len(prefix):end]
            batches.append((torch.tensor([ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = [0.0]
    for _ in range(steps):
        # Every turn in every step: the reported loss is the worst turn's, not the last one's.
        parts = [model(input_ids=ids_t, labels=labels_t).loss for ids_t, labels_t in batches]
        optimizer.zero_grad()
        torch.stack(parts).sum().backward()
        optimizer.step()
        losses = [float(p.detach()) for p in parts]
    model.eval()
    return max(losses)
