// The shapes kvl synth knows: real models' (random weights, for speed on real shapes) and small
// test shapes of every architecture that exercise each feature the forward pass has.
#include <fmt/format.h>

#include <functional>

#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

// A llama-layout shape (name, dim, layers, heads, kv heads, ffn, vocab, context, rope base, eps,
// tied) with the architecture's own fields set by `more`.
ModelShape Shape(ModelShape s, const std::function<void(ModelShape&)>& more) {
  more(s);
  return s;
}

}  // namespace

const std::vector<ModelShape>& KnownModelShapes() {
  static const std::vector<ModelShape> shapes = {
      // name, dim, layers, heads, kv heads, ffn, vocab, context, rope base, eps, tied
      // A few-hundred-KiB model for tests of every weight type through the whole engine.
      {"tiny-test", 128, 2, 4, 2, 256, 512, 256, 10000.0f, 1e-5f, false},
      // The same with rows of 256 values, which K-quant super-blocks need; 8 layers so that a
      // "_M" mix has layers of both kinds.
      {"tiny-test-256", 256, 8, 4, 2, 512, 512, 256, 10000.0f, 1e-5f, false},
      {"stories15m", 288, 6, 6, 6, 768, 32000, 256, 10000.0f, 1e-5f, true},
      {"stories110m", 768, 12, 12, 12, 2048, 32000, 1024, 10000.0f, 1e-5f, true},
      {"smollm-135m", 576, 30, 9, 3, 1536, 49152, 2048, 10000.0f, 1e-5f, true},
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, 1e-5f, false},
      {"llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, 1e-5f, false},
      {"mistral-7b", 4096, 32, 32, 8, 14336, 32000, 32768, 1000000.0f, 1e-5f, false},
      // Today's families, in their released shapes.
      Shape({"llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f, 1e-5f, true},
            [](ModelShape& s) { s.head_dim = 64; s.llama3_rope_factor = 32.0f; }),
      Shape({"llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0f, 1e-5f, false},
            [](ModelShape& s) { s.llama3_rope_factor = 8.0f; }),
      Shape({"mistral-nemo-12b", 5120, 40, 32, 8, 14336, 131072, 1024000, 1000000.0f, 1e-5f, false},
            [](ModelShape& s) { s.head_dim = 128; }),
      {"smollm2-135m", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0f, 1e-5f, true},
      {"smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, 8192, 130000.0f, 1e-5f, true},
      Shape({"qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) { s.architecture = "qwen2"; }),
      Shape({"qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 32768, 1000000.0f, 1e-6f, false},
            [](ModelShape& s) { s.architecture = "qwen2"; }),
      Shape({"qwen3-0.6b", 1024, 28, 16, 8, 3072, 151936, 40960, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) { s.architecture = "qwen3"; s.head_dim = 128; }),
      Shape({"qwen3-8b", 4096, 36, 32, 8, 12288, 151936, 40960, 1000000.0f, 1e-6f, false},
            [](ModelShape& s) { s.architecture = "qwen3"; s.head_dim = 128; }),
      // Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B): 128 experts of 768, 8 per token.
      Shape({"qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 40960, 1000000.0f, 1e-6f, false},
            [](ModelShape& s) {
              s.architecture = "qwen3moe";
              s.head_dim = 128;
              s.num_experts = 128;
              s.num_experts_used = 8;
              s.expert_ffn_dim = 768;
            }),
      Shape({"gemma-2-2b", 2304, 26, 8, 4, 9216, 256000, 8192, 10000.0f, 1e-6f, true},
            [](ModelShape& s) {
              s.architecture = "gemma2";
              s.head_dim = 256;
              s.sliding_window = 4096;
              s.attn_softcap = 50.0f;
              s.final_softcap = 30.0f;
            }),
      Shape({"gemma-3-1b", 1152, 26, 4, 1, 6912, 262144, 32768, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) {
              s.architecture = "gemma3";
              s.head_dim = 256;
              s.sliding_window = 512;
              s.sliding_window_pattern = 6;
              s.rope_freq_base_local = 10000.0f;
            }),
      Shape({"gemma-3-4b", 2560, 34, 8, 4, 10240, 262208, 131072, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) {
              s.architecture = "gemma3";
              s.head_dim = 256;
              s.sliding_window = 1024;
              s.sliding_window_pattern = 6;
              s.rope_freq_base_local = 10000.0f;
              s.rope_scale_linear = 8.0f;
            }),
      // Phi-3-mini-128k: LongRoPE past its original 4096 positions.
      Shape({"phi-3-mini", 3072, 32, 32, 32, 8192, 32064, 131072, 10000.0f, 1e-5f, false},
            [](ModelShape& s) { s.architecture = "phi3"; s.rope_original_context = 4096; }),

      // Small test shapes: rows of 256 (K-quant blocks), random norms and biases, and each
      // architecture's features at sizes that make them matter (a window of 6 tokens, soft-caps
      // of a few units so that tanh bites, large RoPE factors, head_dim not dim / heads, GQA).
      Shape({"test-llama3", 256, 3, 4, 2, 512, 512, 1024, 500000.0f, 1e-5f, true},
            [](ModelShape& s) { s.head_dim = 128; s.random_rope_factors = 16.0f; s.random_norms = true; }),
      Shape({"test-qwen2", 256, 3, 4, 2, 512, 512, 1024, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) { s.architecture = "qwen2"; s.random_norms = true; }),
      Shape({"test-qwen3", 256, 3, 4, 2, 512, 512, 1024, 1000000.0f, 1e-6f, false},
            [](ModelShape& s) { s.architecture = "qwen3"; s.head_dim = 128; s.random_norms = true; }),
      Shape({"test-gemma2", 256, 4, 4, 2, 512, 512, 1024, 10000.0f, 1e-6f, true},
            [](ModelShape& s) {
              s.architecture = "gemma2";
              s.head_dim = 128;
              s.sliding_window = 6;
              s.attn_softcap = 4.0f;
              s.final_softcap = 3.0f;
              s.random_norms = true;
            }),
      Shape({"test-gemma3", 256, 7, 4, 1, 512, 512, 1024, 1000000.0f, 1e-6f, true},
            [](ModelShape& s) {
              s.architecture = "gemma3";
              s.head_dim = 64;
              s.sliding_window = 6;
              s.sliding_window_pattern = 6;
              s.rope_freq_base_local = 10000.0f;
              s.rope_scale_linear = 8.0f;
              s.random_norms = true;
            }),
      Shape({"test-phi3", 256, 3, 4, 4, 512, 512, 1024, 10000.0f, 1e-5f, false},
            [](ModelShape& s) {
              s.architecture = "phi3";
              s.rope_original_context = 64;
              s.random_norms = true;
            }),
      // Experts: 8 of 256, 3 per token (so that the renormalized weights and their rank-order sum
      // matter), beside a dense feed_forward_length the qwen3moe forward pass does not use.
      Shape({"test-qwen3moe", 256, 3, 4, 2, 768, 512, 1024, 1000000.0f, 1e-6f, false},
            [](ModelShape& s) {
              s.architecture = "qwen3moe";
              s.head_dim = 128;
              s.random_norms = true;
              s.num_experts = 8;
              s.num_experts_used = 3;
              s.expert_ffn_dim = 256;
            }),
      // Mixtral's layout (a llama file with experts of feed_forward_length), top-2 of 4.
      Shape({"test-mixtral", 256, 3, 4, 2, 256, 512, 1024, 1000000.0f, 1e-5f, false},
            [](ModelShape& s) {
              s.random_norms = true;
              s.num_experts = 4;
              s.num_experts_used = 2;
            }),
  };
  return shapes;
}

StatusOr<ModelShape> FindModelShape(const std::string& name) {
  std::string names;
  for (const ModelShape& s : KnownModelShapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  return NotFoundError(fmt::format("unknown model shape '{}' (known: {})", name, names));
}

}  // namespace kvl
