#!/usr/bin/python3
"""Writes the held-out text that ships beside the model (models/<name>.heldout.txt): whole
held-out documents, in the split's seeded order, joined by a blank line, up to --max-bytes. This
is the text `kvl perplexity` and llama-perplexity are compared on; it was never trained on."""
import argparse

DOC_SEPARATOR = "\n\f\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--heldout", required=True, help="corpus heldout.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=250_000)
    args = ap.parse_args()
    with open(args.heldout, encoding="utf-8") as f:
        docs = [d.strip("\n") for d in f.read().split(DOC_SEPARATOR) if d.strip()]
    kept, size = [], 0
    for doc in docs:
        n = len(doc.encode("utf-8")) + 2
        if kept and size + n > args.max_bytes:
            break
        kept.append(doc)
        size += n
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(kept) + "\n")
    print(f"{args.out}: {len(kept)} of {len(docs)} held-out documents, {size} bytes")


if __name__ == "__main__":
    main()
