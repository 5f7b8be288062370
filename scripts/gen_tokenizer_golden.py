#!/usr/bin/env python3
"""Writes the tokenizer's golden corpus and llama.cpp's ids for it (tests/tokenizer/golden/).

The corpus is the hard cases of tokenization (contractions in any case, digit runs, CJK,
Devanagari and Arabic with combining marks, NFC against NFD, emoji with joiners, runs of CR/LF/tab,
U+0085 / U+00A0 / U+3000, leading and trailing spaces, code, special-token texts glued to words,
the empty string, invalid UTF-8). For each of llama.cpp's vocab-only GGUFs the ids come from
llama.cpp's own tokenizer (llama_tokenize in libllama, as llama-tokenize calls it; a small helper is
compiled against the build for it, since llama-tokenize cannot turn parse_special on), once with
special tokens parsed and once without, no BOS/EOS:

    python3 scripts/gen_tokenizer_golden.py --llama-cpp /tmp/llama.cpp

tests/tokenizer/tokenizer_golden_test.cc checks kvlattice's ids against these files.
"""
import argparse
import json
import os
import subprocess
import tempfile

VOCABS = ["llama-bpe", "qwen2", "qwen35", "phi-3", "llama-spm", "gpt-2", "starcoder", "deepseek-llm",
          "deepseek-coder", "falcon", "mpt", "refact", "command-r"]

SPECIALS = ("hello<|eot_id|>world <|begin_of_text|>x<|start_header_id|>user<|end_header_id|>\n\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<s>text</s><|endoftext|>x"
            "<|end|> <|user|>q<|assistant|><end_of_turn><start_of_turn>model\n<unk> <|fim_prefix|>a")

CORPUS = [
    ("empty", ""),
    ("contractions", "I'm, you're, he's, they've, we'll, she'd, it's. DON'T I'M You'Re 'S 'T 'RE "
                     "'VE 'M 'LL 'D 's 't 're 've 'm 'll 'd"),
    ("curly_apostrophes", "it\u2019s l'homme aujourd'hui rock'n'roll ' '' x'"),
    ("digits", "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 007 \u0663\u0664\u0665 "
               "\u00b2\u00b3 \u00bd \u216b 2024\ub144"),
    ("cjk", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002"
            "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3002"
            "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4."),
    ("devanagari", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, "
                   "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0939\u093f\u0928\u094d\u0926\u0940\u0964"),
    ("arabic", "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u0628\u0650\u0627\u0644"
               "\u0652\u0639\u064e\u0627\u0644\u064e\u0645\u0650\u060c \u0647\u064e\u0630\u064e\u0627"),
    ("nfc", "caf\u00e9 \u00c5ngstr\u00f6m \ud55c"),
    ("nfd", "cafe\u0301 A\u030angstro\u0308m \u1112\u1161\u11ab"),
    ("emoji_zwj", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f44d\U0001f3fd "
                  "\U0001f3f3\ufe0f\u200d\U0001f308 \u2764\ufe0f \U0001f999!"),
    ("crlf_tabs", "a\r\n\r\nb\n\n\n\tc\t\t\r\r d \n \n\r\n"),
    ("unicode_spaces", "x\u0085y\u00a0z\u3000w \u00a0\u00a0 \u3000\u3000end\u2028\u2029 \u202f."),
    ("leading_spaces", "   leading"),
    ("trailing_spaces", "trailing   "),
    ("both_spaces", "  both  "),
    ("one_space", " "),
    ("spaces_only", "     "),
    ("newline_only", "\n"),
    ("code", "def f(x):\n    return x**2 + 1  # comment\n\nint main() { printf(\"%d\\n\", a[i]++); }\n"
             "    if (a != b && c >= 0) {\n\t\treturn -1;\n\t}\n"),
    ("specials_glued", SPECIALS),
    ("invalid_utf8", b"\xff\xfe abc \x80\x81 \xe4\xb8 \xc3 end"),
    ("invalid_utf8_forms", b"\xc0\xaf overlong \xed\xa0\x80 surrogate \xf0\x80\x80\x80 x \xe4\xb8"),
    ("scripts", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a"
                "\u0438\u0439 \u05e2\u05d1\u05e8\u05d9\u05ea \u0e44\u0e17\u0e22 \u10e5\u10d0\u10e0"
                "\u10d7\u10e3\u10da\u10d8 Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u"),
    ("long_spaces", "a" + " " * 20 + "b" + "\n" * 5 + "c" + "\t" * 4),
    ("punctuation", "...!!!???\u2014\u2013-_*#@$%^&()[]{}<>/\\|~`\"' \u00bf\u00a1 \u00ab\u00bb"),
    ("case_mapping", "\u0130stanbul \u0131i \u00df \u1e9e \ufb01 \ufb02 \u212a"),
    ("urls", "https://example.com/path?q=1&r=2#frag mail@example.org"),
    ("letters_digits", "w048 7tuijk dsdfhu 3rd 2nd 1st 10km x86_64"),
    ("math", "\u2211_{i=1}^{n} x\u00b2 \u2264 \u221e \u2260 \u2202f/\u2202x"),
    ("zero_width", "a\u200bb\u200cc\u200dd\ufeffe"),
    ("controls", "\x01\x02\x1b[31mred\x1b[0m\x7f"),
    ("repeats", "a" * 40 + " " + "ab" * 15),
    ("uppercase", "HELLO WORLD THIS IS UPPERCASE \u00c9COLE \u00c4\u00d6\u00dc"),
    ("camel_case", "getHTTPResponseCode XMLHttpRequest iPhone McDonald's"),
    ("mixed_paragraph", "The year 2024 \u2014 \u201cquotes\u201d \u2018single\u2019 \u00a7 3.1, "
                        "\u00a5500 \u20ac20 \u00a320. \u00c0 bient\u00f4t!\n\n\u00bfQu\u00e9 tal?"),
]


def as_bytes(text):
    return text if isinstance(text, bytes) else text.encode("utf-8")


# llama-tokenize cannot turn parse_special on, so the ids come from llama.cpp's library itself,
# through this helper (compiled at generation time against the llama.cpp build; never committed):
# llama_tokenize(vocab, text, add_special=false, parse_special) on a vocab-only load.
HELPER = r"""
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "llama.h"
static void quiet(ggml_log_level, const char*, void*) {}
int main(int argc, char** argv) {
  // golden_tokenize MODEL FILE...: for each file, its ids without and with parse_special.
  if (argc < 3) return 2;
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 3;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  for (int a = 2; a < argc; ++a) {
    std::ifstream in(argv[a], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const bool parse_special : {false, true}) {
      std::vector<llama_token> ids(text.size() + 16);
      int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(),
                             false, parse_special);
      if (n < 0) return 4;
      std::printf("[");
      for (int i = 0; i < n; ++i) std::printf(i ? ", %d" : "%d", ids[i]);
      std::printf("]\n");
    }
  }
  llama_model_free(model);
  return 0;
}
"""


def build_helper(llama_dir, workdir):
    src = os.path.join(workdir, "golden_tokenize.cc")
    exe = os.path.join(workdir, "golden_tokenize")
    with open(src, "w") as f:
        f.write(HELPER)
    lib = os.path.join(llama_dir, "build", "bin")
    subprocess.run(["g++", "-std=c++17", "-O1", src, "-I", os.path.join(llama_dir, "include"),
                    "-I", os.path.join(llama_dir, "ggml", "include"), "-L", lib, "-lllama",
                    "-Wl,-rpath," + lib, "-o", exe], check=True)
    return exe


def tokenize_all(helper, model, texts, workdir):
    """[(ids without parse_special, ids with)] for each text, in one load of the vocab."""
    paths = []
    for i, data in enumerate(texts):
        path = os.path.join(workdir, f"text{i}.bin")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    out = subprocess.run([helper, model] + paths, check=True, capture_output=True).stdout.decode()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert len(lines) == 2 * len(texts), (model, len(lines))
    return [(lines[2 * i], lines[2 * i + 1]) for i in range(len(texts))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", required=True,
                        help="a llama.cpp checkout built in build/ (libllama.so in build/bin)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                      "tokenizer", "golden"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    corpus = [{"name": name, "hex": as_bytes(text).hex()} for name, text in CORPUS]
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({"about": "texts as UTF-8 (or deliberately invalid) bytes, hex-encoded; written "
                            "by scripts/gen_tokenizer_golden.py", "texts": corpus}, f, indent=1)
    commit = subprocess.run(["git", "-C", args.llama_cpp, "rev-parse", "HEAD"],
                            capture_output=True).stdout.decode().strip()
    workdir = tempfile.mkdtemp()
    helper = build_helper(args.llama_cpp, workdir)
    for vocab in VOCABS:
        model = os.path.join(args.llama_cpp, "models", f"ggml-vocab-{vocab}.gguf")
        cases = []
        results = tokenize_all(helper, model, [as_bytes(text) for _, text in CORPUS], workdir)
        for (name, _), (plain, special) in zip(CORPUS, results):
            cases.append({"name": name, "parse_special": False, "ids": plain})
            cases.append({"name": name, "parse_special": True, "ids": special})
        with open(os.path.join(args.out, f"{vocab}.json"), "w") as f:
            json.dump({"vocab": f"ggml-vocab-{vocab}.gguf", "llama_cpp_commit": commit,
                       "tool": "llama_tokenize(vocab, text, add_special=false, parse_special)",
                       "cases": cases}, f, separators=(",", ":"))
            f.write("\n")
        print(f"{vocab}: {len(cases)} cases")


if __name__ == "__main__":
    main()
