// kvl synth: random-weight GGUF files in real models' shapes, for benchmarks.
#include <fmt/format.h>

#include <chrono>

#include "cli.h"
#include "kvl/synthetic_model.h"

namespace kvl::cli {

int SynthCommand(const SynthArgs& args) {
  if (args.list || args.shape.empty()) {
    fmt::print("{:<17} {:<8} {:>6} {:>7} {:>6} {:>9} {:>9} {:>7} {:>8} {:>7} {:>10}\n", "shape",
               "arch", "dim", "layers", "heads", "kv heads", "head dim", "ffn", "experts", "vocab",
               "params");
    for (const ModelShape& s : KnownModelShapes()) {
      // experts: "used/count" (the ffn column is then each expert's width).
      const std::string experts =
          s.num_experts > 0 ? fmt::format("{}/{}", s.num_experts_used, s.num_experts) : "-";
      fmt::print("{:<17} {:<8} {:>6} {:>7} {:>6} {:>9} {:>9} {:>7} {:>8} {:>7} {:>10}\n", s.name,
                 s.architecture, s.dim, s.num_layers, s.num_heads, s.num_kv_heads, s.HeadDim(),
                 s.FfnDim(), experts, s.vocab_size, FormatParams(SyntheticParameterCount(s)));
    }
    if (!args.list) {
      fmt::print(stderr, "kvl synth: give --shape NAME --type TYPE -o FILE\n");
      return 1;
    }
    return 0;
  }
  StatusOr<ModelShape> shape = FindModelShape(args.shape);
  if (!shape.ok()) {
    fmt::print(stderr, "kvl: {}\n", shape.status().message());
    return 1;
  }
  SynthOptions options{*shape, DType::kQ8_0, args.seed, args.output};
  options.vocab_path = args.vocab;
  if (!ParseSynthType(args.type, &options)) {
    fmt::print(stderr,
               "kvl: unknown weight type '{}' (use f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, "
               "q4_k_m or q5_k_m)\n",
               args.type);
    return 1;
  }
  if (args.output.empty()) {
    fmt::print(stderr, "kvl: give an output file with -o\n");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  if (Status s = WriteSyntheticModel(options); !s.ok()) {
    fmt::print(stderr, "kvl: {}\n", s.ToString());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (args.vocab.empty()) {
    fmt::print(stderr, "kvl: wrote {} ({} {}, {} parameters) in {:.1f} s\n", args.output,
               shape->name, SynthTypeName(options), FormatParams(SyntheticParameterCount(*shape)),
               seconds);
  } else {
    // The vocab file sets the vocab size, and so the embedding's parameters.
    fmt::print(stderr, "kvl: wrote {} ({} {}, tokenizer of {}) in {:.1f} s\n", args.output,
               shape->name, SynthTypeName(options), args.vocab, seconds);
  }
  return 0;
}

}  // namespace kvl::cli
