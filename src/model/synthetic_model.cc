#include "kvl/synthetic_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "kvl/gguf.h"
#include "kvl/quant.h"

namespace kvl {
namespace {

using quant::BlockQ4_0;
using quant::BlockQ8_0;
using quant::Fp32ToBf16;
using quant::Fp32ToFp16;

// splitmix64: fast, seedable and good enough for weights whose values do not matter.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>(static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0); }

 private:
  uint64_t state_;
};

// A vocab the tokenizer can really use: <unk>, <s>, </s>, 256 byte tokens, then pieces over a
// small alphabet built up by length so that every piece can be reached by pairwise merges.
void AddVocab(GgufWriter& w, int64_t vocab_size) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  const std::vector<std::string> alphabet = {
      "\xE2\x96\x81", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u", "c", "m", "w",
      "f", "g", "y", "p", "b", "v", "k", "j", "x", "q", "z", ".", ",", "!", "?", "'", "\n",
      "T", "S", "A", "I", "O", "L", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  std::vector<std::string> level(alphabet);
  while (static_cast<int64_t>(tokens.size()) < vocab_size) {
    std::vector<std::string> next;
    for (const std::string& piece : level) {
      if (static_cast<int64_t>(tokens.size()) >= vocab_size) break;
      tokens.push_back(piece);
      types.push_back(1);
      for (const std::string& c : alphabet) next.push_back(piece + c);
    }
    level = std::move(next);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.AddString("tokenizer.ggml.model", "llama");
  w.AddStringArray("tokenizer.ggml.tokens", std::move(tokens));
  w.AddFloat32Array("tokenizer.ggml.scores", std::move(scores));
  w.AddInt32Array("tokenizer.ggml.token_type", std::move(types));
  w.AddUint32("tokenizer.ggml.bos_token_id", 1);
  w.AddUint32("tokenizer.ggml.eos_token_id", 2);
  w.AddUint32("tokenizer.ggml.unknown_token_id", 0);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
}

// Fills a [rows][cols] matrix of `type` with values uniform in +-sqrt(3/cols), the scale that
// keeps activations near unit variance through a matmul.
GgufWriter::TensorFiller RandomMatrix(DType type, int64_t cols, uint64_t seed) {
  return [type, cols, seed](uint8_t* out, size_t num_bytes) {
    Rng rng(seed);
    const float amplitude = std::sqrt(3.0f / static_cast<float>(cols));
    switch (type) {
      case DType::kQ8_0: {
        const uint16_t d = Fp32ToFp16(amplitude / 127.0f);
        for (size_t off = 0; off + sizeof(BlockQ8_0) <= num_bytes; off += sizeof(BlockQ8_0)) {
          BlockQ8_0 b;
          b.d = d;
          for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<int8_t>(static_cast<int>(rng.Next() % 255) - 127);
          std::memcpy(out + off, &b, sizeof(b));
        }
        return;
      }
      case DType::kQ4_0: {
        const uint16_t d = Fp32ToFp16(amplitude / 8.0f);
        for (size_t off = 0; off + sizeof(BlockQ4_0) <= num_bytes; off += sizeof(BlockQ4_0)) {
          BlockQ4_0 b;
          b.d = d;
          for (int i = 0; i < 16; ++i) b.qs[i] = static_cast<uint8_t>(rng.Next());
          std::memcpy(out + off, &b, sizeof(b));
        }
        return;
      }
      case DType::kF16:
        for (size_t off = 0; off + 2 <= num_bytes; off += 2) {
          const uint16_t h = Fp32ToFp16(amplitude * rng.Symmetric());
          std::memcpy(out + off, &h, 2);
        }
        return;
      case DType::kBF16:
        for (size_t off = 0; off + 2 <= num_bytes; off += 2) {
          const uint16_t h = Fp32ToBf16(amplitude * rng.Symmetric());
          std::memcpy(out + off, &h, 2);
        }
        return;
      default:
        for (size_t off = 0; off + 4 <= num_bytes; off += 4) {
          const float f = amplitude * rng.Symmetric();
          std::memcpy(out + off, &f, 4);
        }
        return;
    }
  };
}

GgufWriter::TensorFiller Ones() {
  return [](uint8_t* out, size_t num_bytes) {
    const float one = 1.0f;
    for (size_t off = 0; off + 4 <= num_bytes; off += 4) std::memcpy(out + off, &one, 4);
  };
}

}  // namespace

const std::vector<ModelShape>& KnownModelShapes() {
  static const std::vector<ModelShape> shapes = {
      // name, dim, layers, heads, kv heads, ffn, vocab, context, rope base, eps, tied
      // A few-hundred-KiB model for tests of every weight type through the whole engine.
      {"tiny-test", 128, 2, 4, 2, 256, 512, 256, 10000.0f, 1e-5f, false},
      {"stories15m", 288, 6, 6, 6, 768, 32000, 256, 10000.0f, 1e-5f, true},
      {"stories110m", 768, 12, 12, 12, 2048, 32000, 1024, 10000.0f, 1e-5f, true},
      {"smollm-135m", 576, 30, 9, 3, 1536, 49152, 2048, 10000.0f, 1e-5f, true},
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, 1e-5f, false},
      {"llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, 1e-5f, false},
      {"mistral-7b", 4096, 32, 32, 8, 14336, 32000, 32768, 1000000.0f, 1e-5f, false},
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

int64_t SyntheticParameterCount(const ModelShape& s) {
  const int64_t head_dim = s.dim / s.num_heads;
  const int64_t kv_dim = s.num_kv_heads * head_dim;
  const int64_t per_layer =
      2 * s.dim + s.dim * s.dim * 2 + 2 * s.dim * kv_dim + 3 * s.dim * s.ffn_dim;
  return s.num_layers * per_layer + s.dim + s.vocab_size * s.dim * (s.tied_output ? 1 : 2);
}

Status WriteSyntheticModel(const SynthOptions& o) {
  const ModelShape& s = o.shape;
  const DTypeTraits& traits = Traits(o.weight_type);
  if (!traits.supported) {
    return InvalidArgumentError(fmt::format("weight type {} cannot be synthesized", traits.name));
  }
  const int64_t head_dim = s.dim / s.num_heads;
  const int64_t kv_dim = s.num_kv_heads * head_dim;
  for (int64_t cols : {s.dim, s.ffn_dim}) {
    if (cols % traits.block_elements != 0) {
      return InvalidArgumentError(fmt::format("shape '{}' has rows of {} values, not a multiple of "
                                              "{}'s block of {}",
                                              s.name, cols, traits.name, traits.block_elements));
    }
  }

  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("general.name", fmt::format("{} (synthetic, random weights)", s.name));
  w.AddUint32("general.file_type", o.weight_type == DType::kF32    ? 0
                                   : o.weight_type == DType::kF16  ? 1
                                   : o.weight_type == DType::kQ4_0 ? 2
                                   : o.weight_type == DType::kQ8_0 ? 7
                                                                   : 32);
  w.AddUint32("llama.context_length", static_cast<uint32_t>(s.context_length));
  w.AddUint32("llama.embedding_length", static_cast<uint32_t>(s.dim));
  w.AddUint32("llama.block_count", static_cast<uint32_t>(s.num_layers));
  w.AddUint32("llama.feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  w.AddUint32("llama.attention.head_count", static_cast<uint32_t>(s.num_heads));
  w.AddUint32("llama.attention.head_count_kv", static_cast<uint32_t>(s.num_kv_heads));
  w.AddUint32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.AddFloat32("llama.rope.freq_base", s.rope_freq_base);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", s.norm_eps);
  w.AddUint32("llama.vocab_size", static_cast<uint32_t>(s.vocab_size));
  AddVocab(w, s.vocab_size);

  uint64_t seed = o.seed;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    w.AddTensor(name, o.weight_type, {cols, rows}, RandomMatrix(o.weight_type, cols, seed++));
  };
  matrix("token_embd.weight", s.vocab_size, s.dim);
  w.AddTensor("output_norm.weight", DType::kF32, {s.dim}, Ones());
  if (!s.tied_output) matrix("output.weight", s.vocab_size, s.dim);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    w.AddTensor(b + "attn_norm.weight", DType::kF32, {s.dim}, Ones());
    matrix(b + "attn_q.weight", s.dim, s.dim);
    matrix(b + "attn_k.weight", kv_dim, s.dim);
    matrix(b + "attn_v.weight", kv_dim, s.dim);
    matrix(b + "attn_output.weight", s.dim, s.dim);
    w.AddTensor(b + "ffn_norm.weight", DType::kF32, {s.dim}, Ones());
    matrix(b + "ffn_gate.weight", s.ffn_dim, s.dim);
    matrix(b + "ffn_up.weight", s.ffn_dim, s.dim);
    matrix(b + "ffn_down.weight", s.dim, s.ffn_dim);
  }
  return w.Write(o.output_path);
}

}  // namespace kvl
