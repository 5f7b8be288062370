#include "kvl/synthetic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <memory>
#include <string_view>

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
// `last_control`, where not empty, replaces the last piece as a control token: llama.cpp's vocab
// loader looks up Phi-3's "<|endoftext|>" by name and refuses a Phi-3 file without it.
void AddVocab(GgufWriter& w, int64_t vocab_size, const std::string& last_control = "") {
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
  if (!last_control.empty()) {
    tokens.back() = last_control;
    types.back() = 3;
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

// n floats uniform in center +- amplitude.
GgufWriter::TensorFiller RandomFloats(uint64_t seed, float center, float amplitude) {
  return [seed, center, amplitude](uint8_t* out, size_t num_bytes) {
    Rng rng(seed);
    for (size_t off = 0; off + 4 <= num_bytes; off += 4) {
      const float f = center + amplitude * rng.Symmetric();
      std::memcpy(out + off, &f, 4);
    }
  };
}

GgufWriter::TensorFiller Floats(std::vector<float> values) {
  return [values = std::move(values)](uint8_t* out, size_t num_bytes) {
    std::memcpy(out, values.data(), std::min(num_bytes, values.size() * sizeof(float)));
  };
}

// RoPE frequency factors (divisors of each pair's angle): Llama-3.1's rope_freqs as its converter
// computes them (low_freq_factor 1, high_freq_factor 4, original context 8192), random ones for
// test shapes, or Phi-3's LongRoPE short (near 1) and long (up to ~40) sets.
void AddRopeFactors(const ModelShape& s, uint64_t& seed, GgufWriter& w) {
  const int64_t half = s.HeadDim() / 2;
  if (s.llama3_rope_factor > 0.0f) {
    std::vector<float> factors;
    const double low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(s.rope_freq_base),
                                   -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
      const double wavelen = 2.0 * M_PI / freq;
      double f = 1.0;
      if (wavelen > low_wavelen) {
        f = s.llama3_rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
        f = 1.0 / ((1.0 - smooth) / s.llama3_rope_factor + smooth);
      }
      factors.push_back(static_cast<float>(f));
    }
    w.AddTensor("rope_freqs.weight", DType::kF32, {half}, Floats(std::move(factors)));
  } else if (s.random_rope_factors > 0.0f) {
    const float mid = (1.0f + s.random_rope_factors) / 2.0f;
    w.AddTensor("rope_freqs.weight", DType::kF32, {half},
                RandomFloats(seed++, mid, s.random_rope_factors - mid));
  }
  if (s.rope_original_context > 0) {
    w.AddTensor("rope_factors_long.weight", DType::kF32, {half}, RandomFloats(seed++, 20.5f, 19.5f));
    w.AddTensor("rope_factors_short.weight", DType::kF32, {half}, RandomFloats(seed++, 1.15f, 0.15f));
  }
}

int ScalarBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    default: return 8;  // uint64, int64, float64
  }
}

void AppendBytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  // resize + memcpy rather than insert(first, last): g++ 12 warns falsely on the latter
  // (-Wstringop-overflow).
  const size_t size = out.size();
  out.resize(size + n);
  if (n > 0) std::memcpy(out.data() + size, p, n);
}

void AppendString(std::vector<uint8_t>& out, std::string_view str) {
  const uint64_t n = str.size();
  AppendBytes(out, &n, 8);
  AppendBytes(out, str.data(), str.size());
}

// A parsed value back to the bytes that follow its type in a GGUF file (nested arrays are not
// found in tokenizer keys and are written empty).
std::vector<uint8_t> EncodeValue(const GgufValue& v) {
  std::vector<uint8_t> out;
  if (v.type == GgufValueType::kString) {
    AppendString(out, v.str);
  } else if (v.type == GgufValueType::kArray) {
    const uint32_t elem = static_cast<uint32_t>(v.array_type);
    AppendBytes(out, &elem, 4);
    const bool nested = v.array_type == GgufValueType::kArray;
    const uint64_t count = nested ? 0 : v.array_count;
    AppendBytes(out, &count, 8);
    if (v.array_type == GgufValueType::kString) {
      for (std::string_view str : v.strings) AppendString(out, str);
    } else if (!nested) {
      AppendBytes(out, v.array_data, count * static_cast<size_t>(ScalarBytes(v.array_type)));
    }
  } else if (v.type == GgufValueType::kFloat32) {
    const float f = static_cast<float>(v.f);
    AppendBytes(out, &f, 4);
  } else if (v.type == GgufValueType::kFloat64) {
    AppendBytes(out, &v.f, 8);
  } else {
    // Integers and bools, little-endian: the low bytes of the value.
    const uint64_t bits = v.is_integer() && v.i < 0 ? static_cast<uint64_t>(v.i) : v.u;
    AppendBytes(out, &bits, static_cast<size_t>(ScalarBytes(v.type)));
  }
  return out;
}

// Copies every tokenizer.* key of a vocab-only GGUF (as raw values, whatever their types) and
// returns its token count.
StatusOr<int64_t> CopyVocab(const std::string& path, GgufWriter& w) {
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> vocab, GgufFile::Open(path));
  StatusOr<const GgufValue*> tokens = vocab->GetArray("tokenizer.ggml.tokens", GgufValueType::kString);
  if (!tokens.ok()) {
    return InvalidArgumentError(fmt::format("--vocab {}: no tokenizer.ggml.tokens ({})", path,
                                            tokens.status().message()));
  }
  const int64_t count = static_cast<int64_t>((*tokens)->array_count);
  for (const GgufKeyValue& kv : vocab->metadata()) {
    if (kv.key.substr(0, 10) != "tokenizer.") continue;
    w.AddRaw(std::string(kv.key), kv.value.type, EncodeValue(kv.value));
  }
  return count;
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

int64_t SyntheticParameterCount(const ModelShape& s) {
  const int64_t q_dim = s.num_heads * s.HeadDim();
  const int64_t kv_dim = s.num_kv_heads * s.HeadDim();
  const int64_t ffn = s.num_experts > 0 ? s.num_experts * (3 * s.dim * s.FfnDim() + s.dim)
                                        : 3 * s.dim * s.ffn_dim;
  const int64_t per_layer = 2 * s.dim + 2 * s.dim * q_dim + 2 * s.dim * kv_dim + ffn;
  return s.num_layers * per_layer + s.dim + s.vocab_size * s.dim * (s.tied_output ? 1 : 2);
}

Status WriteSyntheticModel(const SynthOptions& o) {
  ModelShape s = o.shape;
  const std::string& arch = s.architecture;
  for (const char* known : {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3"}) {
    if (arch == known) break;
    if (std::string_view(known) == "phi3") {
      return InvalidArgumentError(fmt::format("shape '{}' has architecture '{}', which kvl synth "
                                              "cannot write", s.name, arch));
    }
  }
  GgufWriter w;
  if (!o.vocab_path.empty()) {
    KVL_ASSIGN_OR_RETURN(s.vocab_size, CopyVocab(o.vocab_path, w));
  } else {
    AddVocab(w, s.vocab_size, arch == "phi3" ? "<|endoftext|>" : "");
  }
  const int64_t head_dim = s.HeadDim();
  const int64_t q_dim = s.num_heads * head_dim;
  const int64_t kv_dim = s.num_kv_heads * head_dim;
  for (DType type : {o.weight_type, o.more_bits_type.value_or(o.weight_type)}) {
    const DTypeTraits& traits = Traits(type);
    if (!traits.supported) {
      return InvalidArgumentError(fmt::format("weight type {} cannot be synthesized", traits.name));
    }
    // A K-quant of Qwen2.5-0.5B's 896-wide rows is refused, not mixed with fallback types:
    // llama-quantize makes that mix from an f16 or q8_0 synth.
    for (int64_t cols : {s.dim, s.FfnDim(), q_dim}) {
      if (cols % traits.block_elements != 0) {
        return InvalidArgumentError(fmt::format("shape '{}' has rows of {} values, not a multiple "
                                                "of {}'s block of {}",
                                                s.name, cols, traits.name, traits.block_elements));
      }
    }
  }

  const std::string p = arch + ".";
  w.AddString("general.architecture", arch);
  w.AddString("general.name", fmt::format("{} (synthetic, random weights)", s.name));
  w.AddUint32("general.file_type", FileType(o));
  w.AddUint32(p + "context_length", static_cast<uint32_t>(s.context_length));
  w.AddUint32(p + "embedding_length", static_cast<uint32_t>(s.dim));
  w.AddUint32(p + "block_count", static_cast<uint32_t>(s.num_layers));
  w.AddUint32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  if (s.num_experts > 0) {
    w.AddUint32(p + "expert_count", static_cast<uint32_t>(s.num_experts));
    w.AddUint32(p + "expert_used_count", static_cast<uint32_t>(s.num_experts_used));
    if (s.expert_ffn_dim > 0) {
      w.AddUint32(p + "expert_feed_forward_length", static_cast<uint32_t>(s.expert_ffn_dim));
    }
  }
  w.AddUint32(p + "attention.head_count", static_cast<uint32_t>(s.num_heads));
  w.AddUint32(p + "attention.head_count_kv", static_cast<uint32_t>(s.num_kv_heads));
  if (s.head_dim > 0) {
    w.AddUint32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.AddUint32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.AddUint32(p + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.AddFloat32(p + "rope.freq_base", s.rope_freq_base);
  w.AddFloat32(p + "attention.layer_norm_rms_epsilon", s.norm_eps);
  w.AddUint32(p + "vocab_size", static_cast<uint32_t>(s.vocab_size));
  if (s.sliding_window > 0) w.AddUint32(p + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  if (s.sliding_window_pattern > 0) {
    w.AddUint32(p + "attention.sliding_window_pattern", static_cast<uint32_t>(s.sliding_window_pattern));
  }
  if (s.attn_softcap > 0.0f) w.AddFloat32(p + "attn_logit_softcapping", s.attn_softcap);
  if (s.final_softcap > 0.0f) w.AddFloat32(p + "final_logit_softcapping", s.final_softcap);
  if (s.rope_freq_base_local > 0.0f) w.AddFloat32(p + "rope.freq_base_swa", s.rope_freq_base_local);
  if (s.rope_scale_linear > 0.0f) {
    w.AddString(p + "rope.scaling.type", "linear");
    w.AddFloat32(p + "rope.scaling.factor", s.rope_scale_linear);
  }
  if (s.rope_original_context > 0) {
    // LongRoPE's attention factor, as Phi-3's converter computes it.
    const double scale = static_cast<double>(s.context_length) / static_cast<double>(s.rope_original_context);
    const double factor = scale <= 1.0 ? 1.0
        : std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.rope_original_context)));
    w.AddFloat32(p + "rope.scaling.attn_factor", static_cast<float>(factor));
    w.AddUint32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(s.rope_original_context));
  }

  uint64_t seed = o.seed;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, bool more_bits = false) {
    const DType type = more_bits ? o.more_bits_type.value_or(o.weight_type) : o.weight_type;
    w.AddTensor(name, type, {cols, rows}, RandomMatrix(type, cols, seed++));
  };
  // num_experts matrices of [rows][cols] stacked in one tensor, as llama.cpp's converter writes.
  auto experts = [&](const std::string& name, int64_t rows, int64_t cols, bool more_bits = false) {
    const DType type = more_bits ? o.more_bits_type.value_or(o.weight_type) : o.weight_type;
    w.AddTensor(name, type, {cols, rows, s.num_experts}, RandomMatrix(type, cols, seed++));
  };
  // Norm weights: ones, or uniform in [0.5, 1.5] for the test shapes. Biases: 0 or +-0.5.
  auto norm = [&](const std::string& name, int64_t n) {
    w.AddTensor(name, DType::kF32, {n}, s.random_norms ? RandomFloats(seed++, 1.0f, 0.5f) : Ones());
  };
  auto bias = [&](const std::string& name, int64_t n) {
    w.AddTensor(name, DType::kF32, {n}, RandomFloats(seed++, 0.0f, s.random_norms ? 0.5f : 0.02f));
  };
  matrix("token_embd.weight", s.vocab_size, s.dim);
  norm("output_norm.weight", s.dim);
  if (!s.tied_output) matrix("output.weight", s.vocab_size, s.dim, /*more_bits=*/true);
  AddRopeFactors(s, seed, w);
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    const bool more_bits = UsesMoreBits(l, s.num_layers);
    norm(b + "attn_norm.weight", s.dim);
    if (arch == "phi3") {
      matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, s.dim);
    } else {
      matrix(b + "attn_q.weight", q_dim, s.dim);
      matrix(b + "attn_k.weight", kv_dim, s.dim);
      matrix(b + "attn_v.weight", kv_dim, s.dim, more_bits);
    }
    if (arch == "qwen2") {
      bias(b + "attn_q.bias", q_dim);
      bias(b + "attn_k.bias", kv_dim);
      bias(b + "attn_v.bias", kv_dim);
    }
    if (arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3") {
      norm(b + "attn_q_norm.weight", head_dim);
      norm(b + "attn_k_norm.weight", head_dim);
    }
    matrix(b + "attn_output.weight", s.dim, q_dim);
    if (gemma) norm(b + "post_attention_norm.weight", s.dim);
    norm(b + "ffn_norm.weight", s.dim);
    if (s.num_experts > 0) {
      // The router stays f32 in every type, as llama-quantize leaves ffn_gate_inp.
      w.AddTensor(b + "ffn_gate_inp.weight", DType::kF32, {s.dim, s.num_experts},
                  RandomMatrix(DType::kF32, s.dim, seed++));
      experts(b + "ffn_gate_exps.weight", s.FfnDim(), s.dim);
      experts(b + "ffn_up_exps.weight", s.FfnDim(), s.dim);
      experts(b + "ffn_down_exps.weight", s.dim, s.FfnDim(), more_bits);
    } else if (arch == "phi3") {
      matrix(b + "ffn_up.weight", 2 * s.ffn_dim, s.dim);
    } else {
      matrix(b + "ffn_gate.weight", s.ffn_dim, s.dim);
      matrix(b + "ffn_up.weight", s.ffn_dim, s.dim);
    }
    if (s.num_experts == 0) matrix(b + "ffn_down.weight", s.dim, s.ffn_dim, more_bits);
    if (gemma) norm(b + "post_ffw_norm.weight", s.dim);
  }
  return w.Write(o.output_path);
}

}  // namespace kvl
