// libFuzzer target for the GGUF reader: any input must give a Status or a file whose every value
// and tensor can be read without leaving the buffer (AddressSanitizer checks the reads).
//
// Built with -DKVL_GGUF_FUZZ_SEEDS instead of -fsanitize=fuzzer, main() writes a few tiny valid
// files with GgufWriter into the directory given, as a seed corpus (scripts/run-fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvl/gguf.h"

namespace {

// Touches every byte a value claims, folded into `sum` so the reads cannot be optimized away.
uint64_t TouchValue(const kvl::GgufValue& v) {
  uint64_t sum = v.u + static_cast<uint64_t>(v.i) + static_cast<uint64_t>(v.f != 0.0);
  for (char c : v.str) sum += static_cast<uint8_t>(c);
  if (v.type != kvl::GgufValueType::kArray) return sum;
  if (v.array_data != nullptr) {
    for (uint64_t k = 0; k < v.array_count; ++k) {
      sum += static_cast<uint64_t>(v.ArrayInt(k)) + static_cast<uint64_t>(v.ArrayFloat(k) != 0);
    }
  }
  for (std::string_view s : v.strings) {
    for (char c : s) sum += static_cast<uint8_t>(c);
  }
  for (const kvl::GgufValue& e : v.elements) sum += TouchValue(e);
  return sum;
}

}  // namespace

#ifndef KVL_GGUF_FUZZ_SEEDS

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kvl::GgufFile::FromBuffer(data, size);
  if (!file.ok()) return 0;
  const kvl::GgufFile& f = **file;
  volatile uint64_t sink = 0;
  uint64_t sum = 0;
  for (const kvl::GgufKeyValue& kv : f.metadata()) {
    for (char c : kv.key) sum += static_cast<uint8_t>(c);
    sum += TouchValue(kv.value);
    if (f.Find(kv.key) != &kv.value) __builtin_trap();  // Find must agree with the list
  }
  for (const kvl::GgufTensorInfo& t : f.tensors()) {
    if (t.num_bytes <= 0 || t.data == nullptr) __builtin_trap();
    // First, middle and last byte: if these are in bounds, the whole range is.
    const size_t n = static_cast<size_t>(t.num_bytes);
    sum += t.data[0] + t.data[n / 2] + t.data[n - 1];
    if (f.FindTensor(t.name) != &t) __builtin_trap();
  }
  sink = sum;
  (void)sink;
  return 0;
}

#else  // KVL_GGUF_FUZZ_SEEDS

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  auto fill = [](uint8_t* out, size_t n) {
    for (size_t k = 0; k < n; ++k) out[k] = static_cast<uint8_t>(k * 13 + 1);
  };
  std::vector<std::pair<std::string, kvl::GgufWriter>> seeds(4);
  seeds[0].first = "empty.gguf";
  seeds[1].first = "metadata.gguf";
  seeds[1].second.AddString("general.architecture", "llama");
  seeds[1].second.AddUint32("llama.embedding_length", 64);
  seeds[1].second.AddInt32("t.i32", -1);
  seeds[1].second.AddFloat32("t.f32", 0.5f);
  seeds[1].second.AddBool("t.bool", true);
  seeds[1].second.AddStringArray("tokenizer.ggml.tokens", {"<s>", "a", "bc"});
  seeds[1].second.AddFloat32Array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.0f});
  seeds[1].second.AddInt32Array("tokenizer.ggml.token_type", {3, 1, 1});
  seeds[1].second.AddRaw("t.nested", kvl::GgufValueType::kArray,
                         {0x09, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7});
  seeds[2].first = "tensors.gguf";
  seeds[2].second.AddString("general.architecture", "llama");
  seeds[2].second.AddTensor("a.f32", kvl::DType::kF32, {4, 2}, fill);
  seeds[2].second.AddTensor("b.f16", kvl::DType::kF16, {8}, fill);
  seeds[2].second.AddTensor("c.q8_0", kvl::DType::kQ8_0, {32, 2}, fill);
  seeds[2].second.AddTensor("d.q4_0", kvl::DType::kQ4_0, {32}, fill);
  seeds[3].first = "aligned64.gguf";
  seeds[3].second.SetAlignment(64);
  seeds[3].second.AddTensor("w", kvl::DType::kBF16, {3, 1, 2, 1}, fill);
  for (const auto& [name, writer] : seeds) {
    const kvl::Status s = writer.Write(dir + "/" + name);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

#endif  // KVL_GGUF_FUZZ_SEEDS
