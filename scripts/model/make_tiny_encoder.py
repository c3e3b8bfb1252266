"""Build a tiny sentence-transformers encoder with random weights, offline: a BERT (`BertModel`)
with a WordPiece tokenizer trained on scripts/model/corpus.txt, plus the sentence-transformers
files (modules.json, 1_Pooling/config.json, sentence_bert_config.json) that pick its pooling.

The tests' stand-in for all-MiniLM-L6-v2 (same layout, same code paths, a second to build):

    python -m scripts.model.make_tiny_encoder /tmp/tiny-encoder --pooling mean --normalize

Same arguments, same bytes: the weights come from a fixed seed, the tokenizer from a fixed corpus.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel, BertTokenizerFast

CORPUS = Path(__file__).with_name("corpus.txt")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# sentence-transformers' Pooling switches, by this script's --pooling names.
POOLING_SWITCHES = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def train_tokenizer(corpus: Path, vocab_size: int, max_length: int) -> BertTokenizerFast:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train([str(corpus)], trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )


def sentence_files(output_dir: Path, pooling: str, normalize: bool, dimension: int, max_seq_length: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (output_dir / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    switches = {switch: name == pooling for name, switch in POOLING_SWITCHES.items()}
    (output_dir / "1_Pooling").mkdir(exist_ok=True)
    (output_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": dimension, **switches}, indent=2) + "\n"
    )
    (output_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}) + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--pooling", choices=tuple(POOLING_SWITCHES), default="mean")
    parser.add_argument("--normalize", action="store_true", help="add sentence-transformers' Normalize module")
    parser.add_argument("--vocab-size", type=int, default=400)
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-seq-length", type=int, default=64, help="sentence_bert_config.json's max_seq_length")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tokenizer = train_tokenizer(CORPUS, args.vocab_size, 128)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=args.hidden_size * 2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(args.seed)
    model = BertModel(config).eval()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    tokenizer.save_pretrained(args.output_dir)
    sentence_files(args.output_dir, args.pooling, args.normalize, args.hidden_size, args.max_seq_length)
    print(f"tiny encoder ({args.pooling} pooling, vocab {len(tokenizer)}) written to {args.output_dir}")


if __name__ == "__main__":
    main()
