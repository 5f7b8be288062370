#include "kvl/synthetic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "kvl/gguf.h"
#include "kvl/kquant.h"
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

// Random bytes, 8 at a time.
void RandomBytes(Rng& rng, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(out + i, &r, std::min<size_t>(8, n - i));
  }
}

// K-quant super-blocks written directly (quantizing a billion random floats would be slow): random
// codes with sub-block scales (and mins) in the top half of their range, so every bit of the
// packed scales varies, and super-block scales that put values within about +-amplitude, centred.
void RandomKQuantBlocks(DType type, float amplitude, Rng& rng, uint8_t* out, size_t num_bytes) {
  const size_t block_bytes = static_cast<size_t>(Traits(type).block_bytes);
  for (size_t off = 0; off + block_bytes <= num_bytes; off += block_bytes) {
    uint8_t* b = out + off;
    RandomBytes(rng, b, block_bytes);  // codes (and everything overwritten below)
    if (type == DType::kQ6_K) {
      auto* blk = reinterpret_cast<quant::BlockQ6_K*>(b);
      for (int8_t& sc : blk->scales) {
        const int mag = 64 + static_cast<int>(rng.Next() % 64);
        sc = static_cast<int8_t>(rng.Next() % 2 == 0 ? mag : -mag);
      }
      blk->d = Fp32ToFp16(amplitude / (127.0f * 32.0f));
      continue;
    }
    // Q4_K / Q5_K: value = d * sc * q - dmin * m with q in 0..qmax; dmin = d * qmax / 2 centres
    // a sub-block whose min code equals its scale code.
    const float qmax = type == DType::kQ4_K ? 15.0f : 31.0f;
    const float d = 2.0f * amplitude / (63.0f * qmax);
    quant::ScalesMins sm;
    for (int j = 0; j < 8; ++j) {
      sm.sc[j] = static_cast<uint8_t>(32 + rng.Next() % 32);
      sm.m[j] = static_cast<uint8_t>(32 + rng.Next() % 32);
    }
    const uint16_t dh = Fp32ToFp16(d), dminh = Fp32ToFp16(d * qmax / 2.0f);
    std::memcpy(b, &dh, 2);
    std::memcpy(b + 2, &dminh, 2);
    quant::PackScalesMins(sm, b + 4);
  }
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
      case DType::kQ4_K:
      case DType::kQ5_K:
      case DType::kQ6_K:
        RandomKQuantBlocks(type, amplitude, rng, out, num_bytes);
        return;
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

// llama.cpp's general.file_type (its LLAMA_FTYPE numbering) for what the file mostly holds.
uint32_t FileType(const SynthOptions& o) {
  const bool mix = o.more_bits_type.has_value();
  switch (o.weight_type) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ8_0:
      return 7;
    case DType::kQ4_K:
      return mix ? 15 : 14;  // Q4_K_M : Q4_K_S
    case DType::kQ5_K:
      return mix ? 17 : 16;  // Q5_K_M : Q5_K_S
    case DType::kQ6_K:
      return 18;
    default:
      return 32;  // bf16
  }
}

}  // namespace

bool UsesMoreBits(int64_t layer, int64_t num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 ||
         (layer - num_layers / 8) % 3 == 2;
}

bool ParseSynthType(std::string_view name, SynthOptions* options) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::optional<DType> more_bits;
  if (lower == "q4_k_m" || lower == "q5_k_m") {
    lower.resize(4);
    more_bits = DType::kQ6_K;
  }
  const std::optional<DType> type = ParseDType(lower);
  if (!type || !Traits(*type).supported) return false;
  options->weight_type = *type;
  options->more_bits_type = more_bits;
  return true;
}

std::string SynthTypeName(const SynthOptions& options) {
  return std::string(DTypeName(options.weight_type)) + (options.more_bits_type ? "_m" : "");
}

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
  const int64_t head_dim = s.dim / s.num_heads;
  const int64_t kv_dim = s.num_kv_heads * head_dim;
  for (DType type : {o.weight_type, o.more_bits_type.value_or(o.weight_type)}) {
    const DTypeTraits& traits = Traits(type);
    if (!traits.supported) {
      return InvalidArgumentError(fmt::format("weight type {} cannot be synthesized", traits.name));
    }
    for (int64_t cols : {s.dim, s.ffn_dim}) {
      if (cols % traits.block_elements != 0) {
        return InvalidArgumentError(fmt::format("shape '{}' has rows of {} values, not a multiple "
                                                "of {}'s block of {}",
                                                s.name, cols, traits.name, traits.block_elements));
      }
    }
  }

  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("general.name", fmt::format("{} (synthetic, random weights)", s.name));
  w.AddUint32("general.file_type", FileType(o));
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
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, bool more_bits = false) {
    const DType type = more_bits ? o.more_bits_type.value_or(o.weight_type) : o.weight_type;
    w.AddTensor(name, type, {cols, rows}, RandomMatrix(type, cols, seed++));
  };
  matrix("token_embd.weight", s.vocab_size, s.dim);
  w.AddTensor("output_norm.weight", DType::kF32, {s.dim}, Ones());
  if (!s.tied_output) matrix("output.weight", s.vocab_size, s.dim, /*more_bits=*/true);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    const bool more_bits = UsesMoreBits(l, s.num_layers);
    w.AddTensor(b + "attn_norm.weight", DType::kF32, {s.dim}, Ones());
    matrix(b + "attn_q.weight", s.dim, s.dim);
    matrix(b + "attn_k.weight", kv_dim, s.dim);
    matrix(b + "attn_v.weight", kv_dim, s.dim, more_bits);
    matrix(b + "attn_output.weight", s.dim, s.dim);
    w.AddTensor(b + "ffn_norm.weight", DType::kF32, {s.dim}, Ones());
    matrix(b + "ffn_gate.weight", s.ffn_dim, s.dim);
    matrix(b + "ffn_up.weight", s.ffn_dim, s.dim);
    matrix(b + "ffn_down.weight", s.dim, s.ffn_dim, more_bits);
  }
  return w.Write(o.output_path);
}

}  // namespace kvl
