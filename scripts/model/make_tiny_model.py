"""Build a tiny Llama with random weights and a byte-level BPE tokenizer, offline.

The result is a normal Hugging Face checkpoint directory (config.json,
model.safetensors, tokenizer files), so every code path that loads a real
Llama checkpoint loads this one the same way. Same arguments, same bytes:
the weights come from a fixed seed and the tokenizer from a fixed corpus.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = Path(__file__).with_name("corpus.txt")
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


def train_tokenizer(corpus: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE: every byte sequence is encodable, so CJK and emoji work."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(corpus)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.hidden_size * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        max_position_embeddings=args.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = train_tokenizer(CORPUS, args.vocab_size)
    model = build_model(tokenizer, args)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    tokenizer.save_pretrained(args.output_dir)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny Llama ({n_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}) written to {args.output_dir}")


if __name__ == "__main__":
    main()
