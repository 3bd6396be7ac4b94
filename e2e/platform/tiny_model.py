"""Write a tiny random-weight Llama and a locally trained tokenizer, for the real-engine tier.

Where it fits: ``e2e/platform/engine.sh`` runs this with the engine's own Python (torch,
transformers, tokenizers and safetensors come with vLLM) into the engine cache. Nothing is fetched
from a model hub: the weights are random (seeded) and the byte-level BPE tokenizer is trained on a
corpus generated here, so any prompt encodes and the output is gibberish of the right shape. The
model is small enough that prefill and decode of a few hundred tokens take milliseconds on a CPU,
which leaves the time to the engine machinery pdfleet depends on (scheduler, KV cache, NIXL
transfers, metrics, drain).

    python e2e/platform/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 1024
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>"]
# Llama-shaped: 2 layers, hidden 128, 4 query heads over 2 KV heads (GQA), head_dim 32.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
WORDS = [
    "the",
    "a",
    "prefill",
    "decode",
    "cache",
    "block",
    "token",
    "request",
    "model",
    "serve",
    "fleet",
    "pool",
    "router",
    "drain",
    "scale",
    "latency",
    "first",
    "inter",
    "memory",
    "transfer",
    "remote",
    "engine",
    "worker",
    "pod",
    "node",
    "ready",
    "queue",
    "prompt",
    "answer",
    "stream",
    "chat",
    "user",
    "system",
    "assistant",
    "hello",
    "world",
    "data",
    "value",
    "time",
    "rate",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "and",
    "or",
    "not",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
]


def corpus(lines: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
        out.append(
            " ".join(words) + rng.choice([".", "?", "!", ",", ""]) + f" {rng.randint(0, 999)}"
        )
    return out


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(20_000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIAL[0],
        bos_token=SPECIAL[1],
        eos_token=SPECIAL[2],
        model_max_length=CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    if [fast.convert_tokens_to_ids(t) for t in SPECIAL] != [0, 1, 2]:
        raise SystemExit("special tokens must be ids 0, 1, 2 (the config's pad/bos/eos)")


def write_weights(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    write_tokenizer(tmp)
    write_weights(tmp)
    tmp.rename(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
