#!/usr/bin/python3
"""Trains the SentencePiece BPE tokenizer on the train split and turns both splits into token
streams (uint16 .bin files) for training and evaluation.

The tokenizer is set up so that llama.cpp's SPM tokenizer (and kvl's, which follows it) produce the
same ids as SentencePiece itself: no normalization ("identity": llama.cpp does none), no collapsing
of whitespace, a dummy-prefix space, and byte fallback for every character outside the vocab
(newlines included, as in Llama-2). train.py checks the match on the held-out text with kvl.

Token streams: every document is [BOS] + encode(document), documents concatenated.
"""
import argparse
import os
import random
import sys

import numpy as np
import sentencepiece as spm

SEED = 39
VOCAB_SIZE = 6144
SAMPLE_CHARS = 12_000_000  # lines drawn (seeded) from train.txt to train the tokenizer on
DOC_SEPARATOR = "\f\n"


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [d[:-1] if d.endswith("\n") else d for d in text.split("\n" + DOC_SEPARATOR) if d.strip()]


def train_tokenizer(train_path, prefix):
    with open(train_path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip() and line != "\f"]
    rng = random.Random(SEED)
    rng.shuffle(lines)
    sample, chars = [], 0
    for line in lines:
        if chars >= SAMPLE_CHARS:
            break
        sample.append(line)
        chars += len(line)
    sample_path = prefix + ".sample.txt"
    with open(sample_path, "w", encoding="utf-8") as f:
        f.write("\n".join(sample) + "\n")
    spm.SentencePieceTrainer.train(
        input=sample_path, model_prefix=prefix, model_type="bpe", vocab_size=VOCAB_SIZE,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9999, max_sentence_length=16384, input_sentence_size=0,
        shuffle_input_sentence=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=2, minloglevel=1)
    os.remove(sample_path)


def encode_docs(sp, docs):
    ids = []
    bos = sp.bos_id()
    for piece_ids in sp.encode(docs):
        ids.append(bos)
        ids.extend(piece_ids)
    return np.asarray(ids, dtype=np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", required=True, help="folder with train.txt and heldout.txt")
    ap.add_argument("--out", required=True, help="folder for tokenizer.model and the .bin files")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prefix = os.path.join(args.out, "tokenizer")
    train_tokenizer(os.path.join(args.corpus, "train.txt"), prefix)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    assert sp.vocab_size() < 65536
    for split in ("train", "heldout"):
        docs = read_docs(os.path.join(args.corpus, f"{split}.txt"))
        ids = encode_docs(sp, docs)
        ids.tofile(os.path.join(args.out, f"{split}.bin"))
        chars = sum(len(d) for d in docs)
        print(f"{split}: {len(docs)} documents, {chars / 1e6:.2f} M chars, "
              f"{len(ids) / 1e6:.2f} M tokens ({chars / len(ids):.2f} chars/token)", file=sys.stderr)


if __name__ == "__main__":
    main()
