"""A small pretrained causal LM made offline, for the fine-tuning tests and the benchmark.

A byte-level BPE tokenizer is trained with ``tokenizers`` on the corpus below,
a 2-layer Llama is trained on it for a few hundred steps, and both are saved
with ``save_pretrained``, as a user's checkpoint would be.  Data files for the
three styles (text, instruction, chat) are written from the same generator.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "hen", "ant"]
PLACES = ["mat", "log", "hill", "barn", "tree", "pond", "road", "nest"]
VERBS = ["sat on", "ran to", "slept by", "looked at", "walked past"]


def sentence(rng: random.Random) -> str:
    return f"the {rng.choice(ANIMALS)} {rng.choice(VERBS)} the {rng.choice(PLACES)}."


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(2, 5))) for _ in range(n)]


def sums(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(0, 20), rng.randint(0, 20)) for _ in range(n)]


def write_data(folder: Path, n: int = 200, seed: int = 1) -> dict[str, Path]:
    """``text.jsonl``, ``instruct.jsonl``, ``chat.jsonl`` and ``plain.txt`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = corpus(n, seed)
    pairs = sums(n, seed)
    files = {
        "text": folder / "text.jsonl",
        "instruction": folder / "instruct.jsonl",
        "chat": folder / "chat.jsonl",
        "plain": folder / "plain.txt",
    }
    files["text"].write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    files["instruction"].write_text("".join(
        json.dumps({"instruction": f"add {a} and {b}", "input": "", "output": f"{a + b}"}) + "\n" for a, b in pairs))
    files["chat"].write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"what is {a} plus {b}?"},
        {"role": "assistant", "content": f"{a + b}"},
    ]}) + "\n" for a, b in pairs))
    files["plain"].write_text("\n".join(texts) + "\n")
    return files


def make_checkpoint(folder: Path, *, steps: int = 150, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Train the tokenizer and the model, save both to ``folder``; returns ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = corpus(400, seed)
    texts += [f"### Instruction:\nadd {a} and {b}\n\n### Response:\n{a + b}" for a, b in sums(200, seed + 7)]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=384, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    ids = [tokenizer.bos_token_id]
    for t in texts:
        ids += tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    stream = torch.tensor(ids)
    seq = 64
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - seq, (16,), generator=gen)
        batch = torch.stack([stream[s : s + seq] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
