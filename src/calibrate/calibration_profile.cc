// The machine profile as JSON: SaveProfile, LoadProfile (which trusts nothing in the file) and
// the default location. nlohmann-json exceptions stop here.
#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "calibration_internal.h"
#include "kvl/calibration.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/temp_files.h"
#include "kvl/user_file.h"

namespace kvl {
namespace {

// A profile is a few KiB of JSON; anything this large is not one.
constexpr int64_t kMaxProfileBytes = 16ll << 20;

using Json = nlohmann::ordered_json;  // keeps the fields in the order written, for readers

Json ToJson(const RecomputeCurve& c) {
  Json points = Json::array();
  for (const RecomputePoint& p : c.points) {
    points.push_back(
        {{"tokens", p.tokens}, {"layers", p.layers}, {"position", p.position}, {"ms", p.ms}});
  }
  return {{"call_ms", c.call_ms},
          {"layer_ms", c.layer_ms},
          {"token_layer_ms", c.token_layer_ms},
          {"context_token_layer_ms", c.context_token_layer_ms},
          {"points", points}};
}

Json ToJson(const TransferCurve& c) {
  Json points = Json::array();
  for (const TransferPoint& p : c.points) {
    points.push_back({{"pages", p.pages}, {"page_bytes", p.page_bytes}, {"ms", p.ms}});
  }
  return {{"call_ms", c.call_ms},       {"page_ms", c.page_ms},
          {"gbps", c.gbps},             {"knee_bytes", c.knee_bytes},
          {"large_gbps", c.large_gbps}, {"points", points}};
}

// warm_read only where measured (the analytic defaults have none: every read prices cold).
Json ToJson(const TierCurves& t) {
  Json j = {{"write", ToJson(t.write)}, {"read", ToJson(t.read)}};
  if (!t.warm_read.points.empty()) j["warm_read"] = ToJson(t.warm_read);
  return j;
}

Json ToJson(const MachineProfile& p) {
  Json j;
  j["version"] = p.version;
  j["source"] = p.source;
  j["timestamp"] = p.timestamp;
  j["machine"] = {{"cpu_features", p.cpu_features},
                  {"isa", p.isa},
                  {"threads", p.threads},
                  {"cache_bytes", p.cache_bytes},
                  {"load_average", p.load_average},
                  {"others_cpu_share", p.others_cpu_share},
                  {"sample_spread", p.sample_spread},
                  // Derived from the two above (MeasuredUnderLoad), for the reader; not read back.
                  {"measured_busy", MeasuredUnderLoad(p)}};
  if (!p.measured_because.empty()) j["measured_because"] = p.measured_because;
  const CalibrationModel& m = p.model;
  j["model"] = {
      {"name", m.name},
      {"dim", m.dim},
      {"layers", m.layers},
      {"heads", m.heads},
      {"kv_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"ffn_dim", m.ffn_dim},
      {"weight_type", m.weight_type},
      {"kv_bytes_per_token_per_layer_f32", m.kv_bytes_per_token_per_layer_f32},
      {"residual_bytes_per_token_per_layer_f32", m.residual_bytes_per_token_per_layer_f32}};
  j["matmul"] = Json::array();
  for (const MatmulRate& r : p.matmul) {
    j["matmul"].push_back({{"n_tokens", r.n_tokens},
                           {"kv_proj_gflops", r.kv_proj_gflops},
                           {"layer_gflops", r.layer_gflops}});
  }
  // idle_fraction is derived from the two timings, written for the reader (not read back).
  Json idle = Json::array();
  for (int i = 0; i < p.decode_idle.num_points; ++i) {
    const DecodeIdlePoint& d = p.decode_idle.points[static_cast<size_t>(i)];
    Json point = {{"context", d.context},
                  {"step_ms", d.step_ms},
                  {"batch_ms_per_token", d.batch_ms_per_token},
                  {"idle_fraction", d.Fraction()}};
    if (d.rebuild_rows > 0) {
      point["rebuild_rows"] = d.rebuild_rows;
      point["step_with_rebuild_ms"] = d.step_with_rebuild_ms;
    }
    idle.push_back(std::move(point));
  }
  j["decode"] = {{"batch_tokens", kIdlePrefillTokens}, {"points", idle}};
  j["recompute"] = {{"from_residual", ToJson(p.recompute_from_residual)},
                    {"from_tokens", ToJson(p.recompute_from_tokens)}};
  j["memory"] = {{"bytes", p.memory_bytes},
                 {"read_gbps", p.memory_read_gbps},
                 {"copy_gbps", p.memory_copy_gbps}};
  j["disk"] = {{"dir", p.disk_dir},
               {"bytes", p.disk_bytes},
               {"write_gbps", p.disk_write_gbps},
               {"read_gbps", p.disk_read_gbps},
               {"read_direct", p.disk_read_direct},
               {"random_read_direct", p.disk_random_read_direct},
               {"random_read_median_us", p.disk_random_read_median_us},
               {"random_read_p99_us", p.disk_random_read_p99_us}};
  j["tiers"] = {{"ram", ToJson(p.ram)},
                {"ram_zstd", ToJson(p.ram_zstd)},
                {"disk_buffered", ToJson(p.disk_buffered)},
                {"disk_direct", ToJson(p.disk_direct)},
                {"disk_direct_measured", p.disk_direct_measured}};
  j["compress"] = {{"int8", ToJson(p.compress_int8)}, {"int4", ToJson(p.compress_int4)}};
  j["quality"] = {
      {"kld_tokens", p.kld_tokens}, {"int8_kld", p.int8_kld}, {"int4_kld", p.int4_kld}};
  // What the engine wrote back (kvl/profile_corrections.h), only once it has.
  if (!p.corrections.empty()) {
    Json corrections = Json::array();
    for (const PriceCorrection& c : p.corrections) {
      corrections.push_back({{"key", c.key}, {"scale", c.scale}, {"events", c.events}});
    }
    j["corrections"] = std::move(corrections);
  }
  if (!p.remeasure_reason.empty()) j["remeasure_reason"] = p.remeasure_reason;
  return j;
}

// Reads typed fields out of one JSON object, naming each by its dotted path in errors
// ("disk.read_gbps"). Every getter returns DATA_LOSS for a missing or mistyped value.
class FieldReader {
 public:
  FieldReader(const std::string& file, const Json& object, std::string prefix)
      : file_(file), object_(object), prefix_(std::move(prefix)) {}

  std::string Name(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : fmt::format("{}.{}", prefix_, key);
  }
  Status Error(std::string_view key, std::string_view problem) const {
    return DataLossError(fmt::format("profile '{}': field '{}' {}", file_, Name(key), problem));
  }

  StatusOr<const Json*> Field(std::string_view key) const {
    if (!object_.is_object()) {
      return DataLossError(fmt::format("profile '{}': '{}' is not an object", file_,
                                       prefix_.empty() ? "(top level)" : prefix_));
    }
    auto it = object_.find(std::string(key));
    if (it == object_.end()) return Error(key, "is missing");
    return &*it;
  }
  const std::string& file() const { return file_; }
  bool Has(std::string_view key) const {
    return object_.is_object() && object_.contains(std::string(key));
  }
  StatusOr<FieldReader> Object(std::string_view key) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_object()) return Error(key, "must be an object");
    return FieldReader(file_, *v, Name(key));
  }
  // An integer >= min.
  Status Int(std::string_view key, int64_t min, int64_t* out) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_number_integer())
      return Error(key, fmt::format("must be an integer, got {}", v->dump()));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, fmt::format("is out of range: {}", v->dump()));
    }
    *out = v->get<int64_t>();
    if (*out < min) return Error(key, fmt::format("must be >= {}, got {}", min, *out));
    return Status::Ok();
  }
  // A measured quantity: a finite number > 0.
  Status Positive(std::string_view key, double* out) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_number()) return Error(key, fmt::format("must be a number, got {}", v->dump()));
    *out = v->get<double>();
    if (!std::isfinite(*out) || *out <= 0) {
      return Error(key, fmt::format("must be a positive finite number, got {}", v->dump()));
    }
    return Status::Ok();
  }
  // A finite number >= 0.
  Status NonNegative(std::string_view key, double* out) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_number()) return Error(key, fmt::format("must be a number, got {}", v->dump()));
    *out = v->get<double>();
    if (!std::isfinite(*out) || *out < 0) {
      return Error(key, fmt::format("must be a finite number >= 0, got {}", v->dump()));
    }
    return Status::Ok();
  }
  Status String(std::string_view key, bool allow_empty, std::string* out) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_string()) return Error(key, fmt::format("must be a string, got {}", v->dump()));
    *out = v->get<std::string>();
    if (!allow_empty && out->empty()) return Error(key, "must not be empty");
    return Status::Ok();
  }
  Status Bool(std::string_view key, bool* out) const {
    KVL_ASSIGN_OR_RETURN(const Json* v, Field(key));
    if (!v->is_boolean())
      return Error(key, fmt::format("must be true or false, got {}", v->dump()));
    *out = v->get<bool>();
    return Status::Ok();
  }

 private:
  std::string file_;
  const Json& object_;
  std::string prefix_;
};

// The points of a curve: an array of objects, each read by `read_point`.
template <typename Point, typename ReadPoint>
Status ReadPoints(const FieldReader& curve, ReadPoint&& read_point, std::vector<Point>* out) {
  KVL_ASSIGN_OR_RETURN(const Json* points, curve.Field("points"));
  if (!points->is_array()) return curve.Error("points", "must be an array");
  for (size_t i = 0; i < points->size(); ++i) {
    const std::string key = fmt::format("points[{}]", i);
    if (!(*points)[i].is_object()) return curve.Error(key, "must be an object");
    const FieldReader point(curve.file(), (*points)[i], curve.Name(key));
    Point p;
    KVL_RETURN_IF_ERROR(read_point(point, &p));
    out->push_back(p);
  }
  return Status::Ok();
}

// A recompute curve: non-negative coefficients that price a page above 0 ms.
Status ReadCurve(const FieldReader& parent, std::string_view key, RecomputeCurve* c) {
  KVL_ASSIGN_OR_RETURN(FieldReader curve, parent.Object(key));
  KVL_RETURN_IF_ERROR(curve.NonNegative("call_ms", &c->call_ms));
  KVL_RETURN_IF_ERROR(curve.NonNegative("layer_ms", &c->layer_ms));
  KVL_RETURN_IF_ERROR(curve.NonNegative("token_layer_ms", &c->token_layer_ms));
  KVL_RETURN_IF_ERROR(curve.NonNegative("context_token_layer_ms", &c->context_token_layer_ms));
  if (!(c->Ms(kCalibrationPageTokens, 1, 0) > 0)) {
    return parent.Error(key, "prices every page at 0 ms: its coefficients are all 0");
  }
  return ReadPoints(curve, [](const FieldReader& r, RecomputePoint* p) -> Status {
    KVL_RETURN_IF_ERROR(r.Int("tokens", 1, &p->tokens));
    KVL_RETURN_IF_ERROR(r.Int("layers", 1, &p->layers));
    KVL_RETURN_IF_ERROR(r.Int("position", 0, &p->position));
    return r.Positive("ms", &p->ms);
  }, &c->points);
}

// A transfer curve: non-negative coefficients, some time per page.
Status ReadCurve(const FieldReader& parent, std::string_view key, TransferCurve* c) {
  KVL_ASSIGN_OR_RETURN(FieldReader curve, parent.Object(key));
  KVL_RETURN_IF_ERROR(curve.NonNegative("call_ms", &c->call_ms));
  KVL_RETURN_IF_ERROR(curve.NonNegative("page_ms", &c->page_ms));
  KVL_RETURN_IF_ERROR(curve.NonNegative("gbps", &c->gbps));
  KVL_RETURN_IF_ERROR(curve.Int("knee_bytes", 0, &c->knee_bytes));
  KVL_RETURN_IF_ERROR(curve.NonNegative("large_gbps", &c->large_gbps));
  if (c->knee_bytes > 0 && !(c->large_gbps > 0)) {
    return curve.Error("large_gbps", "must be positive where knee_bytes is");
  }
  if (!(c->Ms(1, 4096) > 0)) {
    return parent.Error(key, "prices every transfer at 0 ms: its coefficients are all 0");
  }
  return ReadPoints(curve, [](const FieldReader& r, TransferPoint* p) -> Status {
    KVL_RETURN_IF_ERROR(r.Int("pages", 1, &p->pages));
    KVL_RETURN_IF_ERROR(r.Int("page_bytes", 1, &p->page_bytes));
    return r.Positive("ms", &p->ms);
  }, &c->points);
}

Status ReadTier(const FieldReader& parent, std::string_view key, TierCurves* t) {
  KVL_ASSIGN_OR_RETURN(FieldReader tier, parent.Object(key));
  KVL_RETURN_IF_ERROR(ReadCurve(tier, "write", &t->write));
  KVL_RETURN_IF_ERROR(ReadCurve(tier, "read", &t->read));
  if (!tier.Has("warm_read")) return Status::Ok();
  KVL_RETURN_IF_ERROR(ReadCurve(tier, "warm_read", &t->warm_read));
  if (t->warm_read.points.empty()) return tier.Error("warm_read", "has no points");
  return Status::Ok();
}

StatusOr<MachineProfile> FromJson(const std::string& file, const Json& j) {
  MachineProfile p;
  const FieldReader top(file, j, "");
  // The version first: a profile from another version may differ in any other field.
  KVL_RETURN_IF_ERROR(top.Int("version", 0, &p.version));
  if (p.version != kProfileVersion) {
    return InvalidArgumentError(fmt::format(
        "profile '{}': field 'version' is {}, but this kvl reads version {}; run `kvl calibrate` "
        "again",
        file, p.version, kProfileVersion));
  }
  KVL_RETURN_IF_ERROR(top.String("source", false, &p.source));
  if (p.source != kProfileSourceMeasured && p.source != kProfileSourceDefault) {
    return top.Error("source", fmt::format("must be \"{}\" or \"{}\", got \"{}\"",
                                           kProfileSourceMeasured, kProfileSourceDefault, p.source));
  }
  // Analytic defaults measured nothing, so their measurement sizes are 0 and there is no disk dir.
  const bool measured = p.source == kProfileSourceMeasured;
  const int64_t min_measured_bytes = measured ? 1 : 0;
  KVL_RETURN_IF_ERROR(top.String("timestamp", false, &p.timestamp));

  KVL_ASSIGN_OR_RETURN(FieldReader machine, top.Object("machine"));
  KVL_RETURN_IF_ERROR(machine.String("cpu_features", true, &p.cpu_features));
  KVL_RETURN_IF_ERROR(machine.String("isa", false, &p.isa));
  KVL_RETURN_IF_ERROR(machine.Int("threads", 1, &p.threads));
  KVL_RETURN_IF_ERROR(machine.Int("cache_bytes", 0, &p.cache_bytes));
  KVL_RETURN_IF_ERROR(machine.NonNegative("load_average", &p.load_average));
  // Recorded since version 5 was first written: absent means not recorded (0).
  if (machine.Has("others_cpu_share"))
    KVL_RETURN_IF_ERROR(machine.NonNegative("others_cpu_share", &p.others_cpu_share));
  if (machine.Has("sample_spread"))
    KVL_RETURN_IF_ERROR(machine.NonNegative("sample_spread", &p.sample_spread));

  KVL_ASSIGN_OR_RETURN(FieldReader model, top.Object("model"));
  CalibrationModel& m = p.model;
  KVL_RETURN_IF_ERROR(model.String("name", true, &m.name));
  KVL_RETURN_IF_ERROR(model.Int("dim", 1, &m.dim));
  KVL_RETURN_IF_ERROR(model.Int("layers", 1, &m.layers));
  KVL_RETURN_IF_ERROR(model.Int("heads", 1, &m.heads));
  KVL_RETURN_IF_ERROR(model.Int("kv_heads", 1, &m.kv_heads));
  KVL_RETURN_IF_ERROR(model.Int("head_dim", 1, &m.head_dim));
  KVL_RETURN_IF_ERROR(model.Int("ffn_dim", 1, &m.ffn_dim));
  KVL_RETURN_IF_ERROR(model.String("weight_type", false, &m.weight_type));
  KVL_RETURN_IF_ERROR(
      model.Int("kv_bytes_per_token_per_layer_f32", 1, &m.kv_bytes_per_token_per_layer_f32));
  KVL_RETURN_IF_ERROR(model.Int("residual_bytes_per_token_per_layer_f32", 1,
                                &m.residual_bytes_per_token_per_layer_f32));

  KVL_ASSIGN_OR_RETURN(const Json* matmul, top.Field("matmul"));
  if (!matmul->is_array() || matmul->empty()) {
    return top.Error("matmul", "must be a non-empty array");
  }
  for (size_t i = 0; i < matmul->size(); ++i) {
    const FieldReader rate_reader(file, (*matmul)[i], fmt::format("matmul[{}]", i));
    if (!(*matmul)[i].is_object())
      return top.Error(fmt::format("matmul[{}]", i), "must be an object");
    MatmulRate r;
    KVL_RETURN_IF_ERROR(rate_reader.Int("n_tokens", 1, &r.n_tokens));
    KVL_RETURN_IF_ERROR(rate_reader.Positive("kv_proj_gflops", &r.kv_proj_gflops));
    KVL_RETURN_IF_ERROR(rate_reader.Positive("layer_gflops", &r.layer_gflops));
    p.matmul.push_back(r);
  }

  KVL_ASSIGN_OR_RETURN(FieldReader decode, top.Object("decode"));
  std::vector<DecodeIdlePoint> idle;
  KVL_RETURN_IF_ERROR(ReadPoints(decode, [](const FieldReader& r, DecodeIdlePoint* d) -> Status {
    KVL_RETURN_IF_ERROR(r.Int("context", 0, &d->context));
    KVL_RETURN_IF_ERROR(r.Positive("step_ms", &d->step_ms));
    KVL_RETURN_IF_ERROR(r.Positive("batch_ms_per_token", &d->batch_ms_per_token));
    // Measured since a later build of version 5: absent means not measured (priced as a rebuild
    // of its own).
    if (!r.Has("rebuild_rows")) return Status::Ok();
    KVL_RETURN_IF_ERROR(r.Int("rebuild_rows", 1, &d->rebuild_rows));
    return r.Positive("step_with_rebuild_ms", &d->step_with_rebuild_ms);
  }, &idle));
  for (size_t i = 0; i < idle.size(); ++i) {
    if (!p.decode_idle.Add(idle[i])) {
      return decode.Error(fmt::format("points[{}]", i),
                          fmt::format("must come after a point of a smaller context, at most {} "
                                      "points",
                                      kMaxDecodeIdlePoints));
    }
  }

  KVL_ASSIGN_OR_RETURN(FieldReader recompute, top.Object("recompute"));
  KVL_RETURN_IF_ERROR(ReadCurve(recompute, "from_residual", &p.recompute_from_residual));
  KVL_RETURN_IF_ERROR(ReadCurve(recompute, "from_tokens", &p.recompute_from_tokens));

  KVL_ASSIGN_OR_RETURN(FieldReader memory, top.Object("memory"));
  KVL_RETURN_IF_ERROR(memory.Int("bytes", min_measured_bytes, &p.memory_bytes));
  KVL_RETURN_IF_ERROR(memory.Positive("read_gbps", &p.memory_read_gbps));
  KVL_RETURN_IF_ERROR(memory.Positive("copy_gbps", &p.memory_copy_gbps));

  KVL_ASSIGN_OR_RETURN(FieldReader disk, top.Object("disk"));
  KVL_RETURN_IF_ERROR(disk.String("dir", !measured, &p.disk_dir));
  KVL_RETURN_IF_ERROR(disk.Int("bytes", min_measured_bytes, &p.disk_bytes));
  KVL_RETURN_IF_ERROR(disk.Positive("write_gbps", &p.disk_write_gbps));
  KVL_RETURN_IF_ERROR(disk.Positive("read_gbps", &p.disk_read_gbps));
  KVL_RETURN_IF_ERROR(disk.Bool("read_direct", &p.disk_read_direct));
  KVL_RETURN_IF_ERROR(disk.Bool("random_read_direct", &p.disk_random_read_direct));
  KVL_RETURN_IF_ERROR(disk.Positive("random_read_median_us", &p.disk_random_read_median_us));
  KVL_RETURN_IF_ERROR(disk.Positive("random_read_p99_us", &p.disk_random_read_p99_us));

  KVL_ASSIGN_OR_RETURN(FieldReader tiers, top.Object("tiers"));
  KVL_RETURN_IF_ERROR(ReadTier(tiers, "ram", &p.ram));
  KVL_RETURN_IF_ERROR(ReadTier(tiers, "ram_zstd", &p.ram_zstd));
  KVL_RETURN_IF_ERROR(ReadTier(tiers, "disk_buffered", &p.disk_buffered));
  KVL_RETURN_IF_ERROR(ReadTier(tiers, "disk_direct", &p.disk_direct));
  KVL_RETURN_IF_ERROR(tiers.Bool("disk_direct_measured", &p.disk_direct_measured));

  KVL_ASSIGN_OR_RETURN(FieldReader compress, top.Object("compress"));
  KVL_RETURN_IF_ERROR(ReadCurve(compress, "int8", &p.compress_int8));
  KVL_RETURN_IF_ERROR(ReadCurve(compress, "int4", &p.compress_int4));

  KVL_ASSIGN_OR_RETURN(FieldReader quality, top.Object("quality"));
  KVL_RETURN_IF_ERROR(quality.Int("kld_tokens", 0, &p.kld_tokens));
  KVL_RETURN_IF_ERROR(quality.NonNegative("int8_kld", &p.int8_kld));
  KVL_RETURN_IF_ERROR(quality.NonNegative("int4_kld", &p.int4_kld));

  // Written by later builds of version 5 (absent: none): why it was measured, and what the
  // engine wrote back.
  if (top.Has("measured_because"))
    KVL_RETURN_IF_ERROR(top.String("measured_because", true, &p.measured_because));
  if (top.Has("corrections")) {
    KVL_ASSIGN_OR_RETURN(const Json* corrections, top.Field("corrections"));
    if (!corrections->is_array()) return top.Error("corrections", "must be an array");
    for (size_t i = 0; i < corrections->size(); ++i) {
      const std::string key = fmt::format("corrections[{}]", i);
      if (!(*corrections)[i].is_object()) return top.Error(key, "must be an object");
      const FieldReader r(file, (*corrections)[i], key);
      PriceCorrection c;
      KVL_RETURN_IF_ERROR(r.String("key", false, &c.key));
      KVL_RETURN_IF_ERROR(r.Positive("scale", &c.scale));
      KVL_RETURN_IF_ERROR(r.Int("events", 0, &c.events));
      p.corrections.push_back(std::move(c));
    }
  }
  if (top.Has("remeasure_reason"))
    KVL_RETURN_IF_ERROR(top.String("remeasure_reason", true, &p.remeasure_reason));
  return p;
}

// Each run of other characters becomes one '_' ("tinyllama-1.1b (synthetic, random weights)" ->
// "tinyllama-1.1b_synthetic_random_weights_").
std::string SanitizeFileName(std::string_view name) {
  std::string out;
  bool replaced = false;  // the last character written stands for a run of others
  for (char ch : name) {
    const bool keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!keep && replaced) continue;
    out += keep ? ch : '_';
    replaced = !keep;
  }
  if (out.empty() || out.find_first_not_of('.') == std::string::npos) out = "model";
  return out;
}

}  // namespace

Status CheckProfileWritable(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return InvalidArgumentError("profile path is empty");
  std::error_code ec;
  const fs::path target(path);
  const fs::file_status status = fs::status(target, ec);
  if (fs::is_directory(status)) {
    return InvalidArgumentError(fmt::format("profile '{}' is a directory", path));
  }
  // SaveProfile renames over the target: a device or a pipe (say /dev/null) would be replaced.
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    return InvalidArgumentError(fmt::format("profile '{}' is not a regular file", path));
  }
  // The nearest existing ancestor must be a writable directory (SaveProfile makes the rest).
  fs::path dir = target.parent_path();
  while (!dir.empty() && !fs::exists(dir, ec)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError(
        fmt::format("profile '{}': '{}' is not a directory", path, dir.string()));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return IoError(fmt::format("profile '{}': cannot write in '{}': {}", path, dir.string(),
                               std::strerror(errno)));
  }
  return Status::Ok();
}

Status SaveProfile(const MachineProfile& profile, const std::string& path) {
  std::string text;
  try {
    text = ToJson(profile).dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    return InvalidArgumentError(fmt::format("profile '{}': cannot encode: {}", path, e.what()));
  }
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) {
      return IoError(fmt::format("profile '{}': cannot create directory '{}': {}", path,
                                 target.parent_path().string(), ec.message()));
    }
  }
  // Written beside the target and renamed over it, so a reader never sees half a profile.
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  const TempFileGuard temp_guard(temp);  // removed by a signal too
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::filesystem::remove(temp, ec);
      return IoError(fmt::format("profile '{}': cannot write '{}'", path, temp));
    }
  }
  std::filesystem::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    return IoError(fmt::format("profile '{}': cannot rename into place: {}", path, ec.message()));
  }
  return Status::Ok();
}

StatusOr<MachineProfile> LoadProfile(const std::string& path) {
  // Through the one door for user-named files: a FIFO or a directory fails at once.
  StatusOr<std::string> text = ReadUserFile(path, "profile", kMaxProfileBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFoundError(fmt::format("profile '{}' does not exist; run `kvl calibrate`", path));
    }
    return text.status();
  }
  try {
    const Json j = Json::parse(*text);
    return FromJson(path, j);
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(fmt::format("profile '{}': not valid JSON: {}", path, e.what()));
  }
}

std::string ProfileKey(const Model& model, const ops::OpsContext& ctx) {
  const ModelConfig& c = model.config();
  std::string name = SanitizeFileName(c.name);
  while (!name.empty() && name.back() == '_') name.pop_back();  // "(...)" at the end of a name
  return fmt::format("{}-{}x{}-{}-{}-t{}", name, c.dim, c.num_layers, model.weight_type_name(),
                     ops::IsaName(ctx.isa()), calibration_internal::ContextThreads(ctx));
}

// The user's cache folder as the XDG base directory spec says: $XDG_CACHE_HOME only when it is
// an absolute path (a relative one "should be ignored"), else $HOME/.cache, else the home the
// password database gives. Never a shared, predictable folder such as /tmp/kvlattice: another
// user could plant a profile there that prices every KV decision.
static std::filesystem::path UserCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME");
      xdg != nullptr && std::filesystem::path(xdg).is_absolute()) {
    return xdg;
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return std::filesystem::path(home) / ".cache";
  }
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr &&
                                                  pw->pw_dir[0] != '\0') {
    return std::filesystem::path(pw->pw_dir) / ".cache";
  }
  // No home at all: a folder named by this user's id under the temp directory, not one that
  // every user shares.
  std::error_code ec;
  return std::filesystem::temp_directory_path(ec) / fmt::format("kvlattice-cache-{}", ::getuid());
}

std::string DefaultProfilePath(std::string_view profile_key) {
  if (const char* env = std::getenv("KVL_PROFILE"); env != nullptr && env[0] != '\0') return env;
  const std::filesystem::path cache = UserCacheDir();
  return (cache / "kvlattice" / fmt::format("profile-{}.json", SanitizeFileName(profile_key)))
      .string();
}

}  // namespace kvl
