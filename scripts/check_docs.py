#!/usr/bin/env python3
"""The docs say only what exists: README.md and docs/*.md checked against the tree and the binary.

  check_docs.py --root DIR [--kvl PATH]   checks the docs of the checkout at DIR
  check_docs.py --self-test --kvl PATH    shows that each check fails on a broken doc

Checks, each failure printed as FILE:LINE: what is wrong:
  - links: every relative markdown link ([text](path), ![alt](path)) names a file or folder that
    exists, and its #anchor, if any, a heading of the markdown file it names (GitHub's anchors);
  - paths: every repository path in inline or fenced code (`src/...`, `include/...`, `tests/...`,
    `scripts/...`, `docs/...`, `bench/...`, `fuzz/...`, `cmake/...`) exists; `*` and `{a,b}`
    are expanded, and a word with a placeholder (`<layer>`, `$DIR`, `...`) is not a path;
  - flags (with --kvl): every flag of a `kvl COMMAND ...` line (fenced code, its continuation
    lines, and inline code) is one kvl COMMAND accepts: kvl's own parser is asked
    (`kvl COMMAND FLAG 1 --help` says COMMAND "has no flag" FLAG only where it has none), so the
    aliases llama.cpp's users type (-np, -ctk) and the llama.cpp flags kvl ignores count.

docs/history/ is the record of what was, and is not checked. Exit status 0: all hold; 1: not.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

PATH_ROOTS = ("src/", "include/", "tests/", "scripts/", "docs/", "bench/", "fuzz/", "cmake/")
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
CHECKED = {"links": 0, "paths": 0, "flags": 0}  # how much each check saw, for the summary


def docs_of(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return [f for f in files if os.path.isfile(f)]


def split_doc(text):
    """(prose, fenced) line lists of (line number, text): prose lines have fenced code blanked."""
    prose, fenced = [], []
    in_fence = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            prose.append((n, ""))
            continue
        (fenced if in_fence else prose).append((n, line))
        if in_fence:
            prose.append((n, ""))
    return prose, fenced


def paragraphs(prose):
    """Consecutive non-blank prose lines joined (inline code may span lines), with the first
    line's number and each character's line."""
    block, first = [], None
    for n, line in prose + [(None, "")]:
        if line.strip():
            if first is None:
                first = n
            block.append((n, line))
            continue
        if block:
            text, lines = "", []
            for bn, bl in block:
                text += bl + "\n"
                lines += [bn] * (len(bl) + 1)
            yield text, lines
        block, first = [], None


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation gone, spaces to '-'."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        seen, anchors = {}, set()
        with open(path, encoding="utf-8") as f:
            prose, _ = split_doc(f.read())
        for _, line in prose:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            k = seen.get(s, 0)
            anchors.add(s if k == 0 else f"{s}-{k}")
            seen[s] = k + 1
        cache[path] = anchors
    return cache[path]


def check_links(doc, prose, problems):
    here = os.path.dirname(doc)
    for text, lines in paragraphs(prose):
        # Links inside inline code are examples, not links.
        masked = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
        for m in LINK.finditer(masked):
            target = m.group(2)
            n = lines[m.start()]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            CHECKED["links"] += 1
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, path)) if path else doc
            if not os.path.exists(full):
                problems.append(f"{doc}:{n}: link to '{target}': {path} does not exist")
                continue
            if anchor and full.endswith(".md") and anchor not in anchors_of(full):
                problems.append(f"{doc}:{n}: link to '{target}': no heading '#{anchor}' in "
                                f"{os.path.relpath(full, here) if path else 'this file'}")


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(path[:m.start()] + alt + path[m.end():])
    return out


def check_paths(doc, root, prose, fenced, problems):
    """Repository paths in inline code and in fenced code (commands, compiler output)."""
    spans = [(n, line) for n, line in fenced]
    for text, lines in paragraphs(prose):
        spans += [(lines[m.start()], m.group(2)) for m in CODE_SPAN.finditer(text)]
    for n, span in spans:
        for word in span.split():
            word = word.strip(".,;:()[]'\"")
            word = re.sub(r"(:\d+)+$", "", word)  # file:line
            if not word.startswith(PATH_ROOTS) or re.search(r"[<>$]|\.\.\.", word):
                continue
            CHECKED["paths"] += 1
            if any(glob.glob(os.path.join(root, p)) for p in expand_braces(word)):
                continue
            problems.append(f"{doc}:{n}: `{word}` does not exist")


def kvl_commands(kvl):
    """{command: set of its subcommands} from kvl --help and each command's --help."""
    def subcommands(args):
        out = subprocess.run([kvl] + args + ["--help"], capture_output=True, text=True, timeout=30)
        names, listing = set(), False
        for line in out.stdout.splitlines():
            if line.startswith("Subcommands:"):
                listing = True
                continue
            if listing:
                m = re.match(r"^  (\S+)\s", line)
                if m:
                    names.add(m.group(1))
                elif line and not line.startswith(" "):
                    listing = False
        return names
    return {c: subcommands([c]) for c in subcommands([])}


def command_lines(fenced, prose):
    """(line number, text) of every `kvl COMMAND ...` in the doc: fenced lines with their
    continuations (a trailing backslash, or lines indented deeper), and inline code."""
    starts = re.compile(r"^(\s*)(?:\$\s+)?(?:\S*/)?kvl\s")
    i = 0
    while i < len(fenced):
        n, line = fenced[i]
        m = starts.match(line)
        i += 1
        if not m:
            continue
        indent = len(m.group(1))
        text = line
        while i < len(fenced) and fenced[i][0] == fenced[i - 1][0] + 1:
            nxt = fenced[i][1]
            if text.rstrip().endswith("\\") or (
                    nxt.strip() and len(nxt) - len(nxt.lstrip()) > indent
                    and not starts.match(nxt)):
                text = text.rstrip().rstrip("\\") + " " + nxt
                i += 1
            else:
                break
        yield n, text
    for text, lines in paragraphs(prose):
        for m in CODE_SPAN.finditer(text):
            span = m.group(2).replace("\n", " ")
            if re.match(r"^(?:\S*/)?kvl\s", span):
                yield lines[m.start()], span


def flags_of(text, commands):
    """(command words, flags) of one `kvl ...` line; None where it names no kvl command."""
    text = re.sub(r"\"[^\"]*\"|'[^']*'", "X", text)  # quoted values are not flags
    text = re.split(r"\s#", text)[0]                   # a comment
    words = text.split()
    start = next(i for i, w in enumerate(words) if re.match(r"^(?:\S*/)?kvl$", w))
    words = words[start + 1:]
    if not words or words[0] not in commands:
        return None
    command = [words[0]]
    rest = words[1:]
    if rest and rest[0] in commands[words[0]]:
        command.append(rest[0])
        rest = rest[1:]
    flags = []
    for w in rest:
        if w in ("&&", "||", ";") or w.startswith((">", "2>", "|")) and len(w) > 1:
            break
        w = w.strip("[](),")
        if not re.match(r"^--?[A-Za-z]", w):
            continue
        flags.append(w.split("=")[0].rstrip("|,"))
    return command, flags


def unknown_flag(kvl, command, flag):
    """kvl's own words where `command` has no `flag`; "" where it has it. kvl checks every flag
    against the command before it parses a value (src/cli/llama_flags.cc, CheckFlagsAreKnown),
    so `kvl COMMAND FLAG 1 --help` either stops there, saying it "has no flag", or goes on: to
    the help (exit 0), or to the dummy value refused (`--spec 1`), which only a known flag meets."""
    out = subprocess.run([kvl] + command + [flag, "1", "--help"],
                         capture_output=True, text=True, timeout=30)
    said = out.stderr.strip().splitlines()
    if out.returncode == 0:
        return ""
    refusal = [line for line in said if "has no flag" in line]
    return refusal[0] if refusal else ""


def check_flags(doc, kvl, commands, prose, fenced, problems, asked={}):
    for n, text in command_lines(fenced, prose):
        parsed = flags_of(text, commands)
        if parsed is None:
            continue
        command, flags = parsed
        for flag in flags:
            key = (tuple(command), flag)
            CHECKED["flags"] += 1
            if key not in asked:
                asked[key] = unknown_flag(kvl, command, flag)
            if asked[key]:
                problems.append(f"{doc}:{n}: kvl {' '.join(command)} {flag}: {asked[key]}")


def check(root, kvl):
    problems = []
    commands = kvl_commands(kvl) if kvl else None
    if kvl and not commands:
        return [f"{kvl} --help lists no commands"]
    for doc in docs_of(root):
        with open(doc, encoding="utf-8") as f:
            prose, fenced = split_doc(f.read())
        check_links(doc, prose, problems)
        check_paths(doc, root, prose, fenced, problems)
        if kvl:
            check_flags(doc, kvl, commands, prose, fenced, problems)
    return problems


def self_test(kvl):
    """A doc tree with one fault of each kind, each of which must be reported by name, and the
    same tree without them, which must pass."""
    good = ("# Title\n\n## Run it: `kvl run`\n\n"
            "See [the docs](docs/A.md#part-two), [run](#run-it-kvl-run) and `src/x.cc`.\n\n"
            "```sh\nkvl run -m M -np 2 --kv-budget 1MiB \\\n    --temp 0   # greedy\n"
            "kvl bench turns -m M\n        [--restart] [-ngl 99]\n```\n\n"
            "Inline: `kvl bench -m M -p 0 -n 0 --prefix 512`.\n")
    faults = {
        "[gone](docs/missing.md)": "docs/missing.md does not exist",
        "[no anchor](docs/A.md#part-three)": "no heading '#part-three'",
        "`src/nothing_here.cc`": "`src/nothing_here.cc` does not exist",
        "```sh\nbash scripts/gone.sh --fast\n```": "`scripts/gone.sh` does not exist",
        "`kvl run -m M --kv-budgte 1MiB`": "kvl run --kv-budgte",
        "`kvl bench turns --no-such-flag`": "kvl bench turns --no-such-flag",
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "src"))
        open(os.path.join(root, "src", "x.cc"), "w").close()
        with open(os.path.join(root, "docs", "A.md"), "w") as f:
            f.write("# A\n\n## Part two\n\nBack to [the README](../README.md).\n")
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write(good)
        clean = check(root, kvl)
        if clean:
            failures.append("a clean tree was reported: " + "; ".join(clean))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write(good + "\n" + "\n\n".join(faults) + "\n")
        found = check(root, kvl)
        for fault, message in faults.items():
            if not any(message in p for p in found):
                failures.append(f"{fault} was not reported (reported: {found})")
        if len(found) != len(faults):
            failures.append(f"{len(faults)} faults, {len(found)} reports: {found}")
    for f in failures:
        print("check_docs self-test:", f)
    print(f"check_docs self-test: {len(faults)} faults planted, "
          f"{'all reported' if not failures else 'NOT all reported'}")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="the checkout whose README.md and docs/*.md are checked")
    parser.add_argument("--kvl", help="the kvl binary whose commands' flags the docs name")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        if not args.kvl:
            parser.error("--self-test needs --kvl")
        return self_test(args.kvl)
    if not args.root:
        parser.error("--root is required")
    problems = check(args.root, args.kvl)
    for p in problems:
        print(p)
    docs = docs_of(args.root)
    print(f"check_docs: {len(docs)} files: {CHECKED['links']} relative links, "
          f"{CHECKED['paths']} paths, {CHECKED['flags']} kvl flags; {len(problems)} problems"
          + ("" if args.kvl else " (flags not checked: no --kvl)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
