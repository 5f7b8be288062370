#!/usr/bin/python3
"""Builds the training corpus from the documentation that Debian packages install.

Each source below is one Debian package (from main, free licence; see README.md for versions and
licences). HTML pages lose their markup, POD files go through pod2text, then every document is
cleaned (tabs to spaces, control characters dropped, runs of blank lines squeezed), paragraphs
that repeat across the corpus (navigation bars, page footers) are kept once, and identical
documents are dropped. A fixed-seed draw then puts whole documents into the held-out split, so no
held-out paragraph is ever trained on.

Output (in --out): train.txt and heldout.txt, documents separated by a form feed line ("\\f\\n"),
plus manifest.json naming each document's source and split.
"""
import argparse
import glob
import hashlib
import html
import html.parser
import json
import os
import random
import re
import subprocess
import sys

SEED = 39
HELDOUT_FRACTION = 0.015
DOC_SEPARATOR = "\f\n"

# (package, glob patterns, kind). Only files the package itself installs are read.
SOURCES = [
    ("debian-reference-en", ["/usr/share/debian-reference/*.en.html"], "html"),
    ("debian-handbook", ["/usr/share/doc/debian-handbook/html/en-US/*.html"], "html"),
    ("debian-policy", ["/usr/share/doc/debian-policy/policy.html/*.html"], "html"),
    ("developers-reference", ["/usr/share/developers-reference/*.html",
                              "/usr/share/doc/developers-reference/*.html"], "html"),
    ("python3.11-doc", ["/usr/share/doc/python3.11/html/**/*.html"], "html"),
    ("python-django-doc", ["/usr/share/doc/python-django-doc/html/**/*.html"], "html"),
    ("perl-doc", ["/usr/share/perl/5.36/pod/*.pod"], "pod"),
    ("git-doc", ["/usr/share/doc/git/html/*.html", "/usr/share/doc/git/html/**/*.html"], "html"),
    ("postgresql-doc-15", ["/usr/share/doc/postgresql-doc-15/html/*.html"], "html"),
    ("sqlite3-doc", ["/usr/share/doc/sqlite3/**/*.html"], "html"),
]

# Generated pages that are lists of identifiers rather than prose (indexes, cross references).
EXCLUDE = ["/sqlite3/requirements", "_crossref.html", "genindex", "modindex", "bookindex",
           "/search.html"]

# Elements whose text is not prose: scripts, styles, and page furniture.
SKIP_TAGS = {"script", "style", "head", "nav", "header", "footer", "noscript", "svg", "form"}
BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "pre", "table", "tr",
              "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "blockquote",
              "hr", "title", "td", "th", "caption", "figure", "body"}


class TextExtractor(html.parser.HTMLParser):
    """HTML to plain text: block elements become paragraph breaks, <pre> keeps its lines."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []
        self.skip_depth = 0
        self.pre_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_TAGS:
            self.skip_depth += 1
        if tag == "pre":
            self.pre_depth += 1
        if tag in BLOCK_TAGS:
            self.parts.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS and self.skip_depth > 0:
            self.skip_depth -= 1
        if tag == "pre" and self.pre_depth > 0:
            self.pre_depth -= 1
        if tag in BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip_depth:
            return
        if self.pre_depth:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self):
        return "".join(self.parts)


def html_to_text(path):
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    parser = TextExtractor()
    parser.feed(raw)
    parser.close()
    return parser.text()


def pod_to_text(path):
    out = subprocess.run(["pod2text", "-w", "100", path], capture_output=True, check=False)
    return out.stdout.decode("utf-8", errors="replace")


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff\u00ad]")


def clean(text):
    """Plain, tokenizer-friendly text: no tabs/CR/control characters, trimmed lines, no runs of
    more than one blank line, no leading/trailing blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = text.replace("\u00a0", " ").replace("\u00b6", "")  # Sphinx's heading-link pilcrows
    text = CONTROL.sub("", text)
    lines = [line.rstrip() for line in text.split("\n")]
    paragraphs, current = [], []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append("\n".join(current))
            current = []
    if current:
        paragraphs.append("\n".join(current))
    # Paragraphs of a single leading-space-only line keep their indentation (code); prose lines
    # that HTML whitespace collapsing left with one leading space lose it.
    out = []
    for p in paragraphs:
        if "\n" not in p:
            p = p.strip()
        if p:
            out.append(p)
    return out


def collect(sources):
    docs = []  # (package, relative path, [paragraphs])
    for package, patterns, kind in sources:
        files = sorted({f for pat in patterns for f in glob.glob(pat, recursive=True)})
        if not files:
            print(f"warning: no files for {package}", file=sys.stderr)
        for path in files:
            if os.path.islink(path) or any(x in path for x in EXCLUDE):
                continue
            text = html_to_text(path) if kind == "html" else pod_to_text(path)
            paragraphs = clean(text)
            if paragraphs:
                docs.append((package, path, paragraphs))
        print(f"{package}: {len(files)} files", file=sys.stderr)
    return docs


def dedup(docs, min_doc_chars=400):
    """Keeps each paragraph's first occurrence in corpus order, then drops documents that end up
    short (index pages, stubs) or identical to an earlier one."""
    seen_paragraphs = set()
    seen_docs = set()
    kept = []
    for package, path, paragraphs in docs:
        fresh = []
        for p in paragraphs:
            key = hashlib.sha1(p.encode("utf-8")).digest()
            if key in seen_paragraphs:
                continue
            seen_paragraphs.add(key)
            fresh.append(p)
        text = "\n\n".join(fresh)
        if len(text) < min_doc_chars:
            continue
        key = hashlib.sha1(text.encode("utf-8")).digest()
        if key in seen_docs:
            continue
        seen_docs.add(key)
        kept.append((package, path, text))
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="folder for train.txt, heldout.txt, manifest.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    docs = dedup(collect(SOURCES))
    rng = random.Random(SEED)
    order = list(range(len(docs)))
    rng.shuffle(order)
    total_chars = sum(len(d[2]) for d in docs)
    heldout, heldout_chars = set(), 0
    # Whole documents go to held-out, in the seeded order, until the fraction is reached.
    for i in order:
        if heldout_chars >= HELDOUT_FRACTION * total_chars:
            break
        heldout.add(i)
        heldout_chars += len(docs[i][2])

    manifest = []
    with open(os.path.join(args.out, "train.txt"), "w", encoding="utf-8") as train_f, \
         open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as held_f:
        # Training documents in seeded order too, so no package forms one long run of the file.
        for i in order:
            package, path, text = docs[i]
            split = "heldout" if i in heldout else "train"
            (held_f if split == "heldout" else train_f).write(text + "\n" + DOC_SEPARATOR)
            manifest.append({"package": package, "path": path, "chars": len(text), "split": split})
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=0)
    by_package = {}
    for m in manifest:
        s = by_package.setdefault(m["package"], [0, 0])
        s[0] += 1
        s[1] += m["chars"]
    for package, (n, chars) in by_package.items():
        print(f"{package}: {n} documents, {chars / 1e6:.1f} M chars", file=sys.stderr)
    print(f"total {len(docs)} documents, {total_chars / 1e6:.1f} M chars; held-out "
          f"{len(heldout)} documents, {heldout_chars / 1e6:.2f} M chars", file=sys.stderr)


if __name__ == "__main__":
    main()
