// A checker for the Prometheus text exposition format (0.0.4), strict enough for the tests:
// every sample belongs to a family declared by # TYPE, names and labels are well formed, values
// parse as numbers, and histogram buckets are cumulative up to +Inf = _count.
#pragma once

#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace kvl::testing {

struct PrometheusCheck {
  std::vector<std::string> errors;
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram | ...
};

inline PrometheusCheck CheckPrometheusText(const std::string& text) {
  static const std::regex kComment(R"(# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) ?(.*))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})? (\S+)( -?[0-9]+)?)");
  static const std::regex kLe(R"(le="([^"]*)\")");
  static const std::regex kType("counter|gauge|histogram|summary|untyped");
  PrometheusCheck check;
  std::map<std::string, double> last_bucket;  // histogram family -> last cumulative count
  std::map<std::string, double> inf_bucket;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto fail = [&](const std::string& why) {
    check.errors.push_back("line " + std::to_string(n) + ": " + why + ": " + line);
  };
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    std::smatch m;
    if (line[0] == '#') {
      if (std::regex_match(line, m, kComment)) {
        if (m[1] == "TYPE") {
          if (!std::regex_match(m[3].str(), kType)) fail("unknown type");
          if (check.types.count(m[2])) fail("family typed twice");
          check.types[m[2]] = m[3];
        }
      } else if (line.rfind("# HELP", 0) == 0 || line.rfind("# TYPE", 0) == 0) {
        fail("malformed HELP/TYPE");
      }
      continue;
    }
    if (!std::regex_match(line, m, kSample)) {
      fail("malformed sample");
      continue;
    }
    const std::string name = m[1];
    const std::string value = m[4];
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    if (value != "+Inf" && value != "-Inf" && value != "NaN" && *end != '\0') fail("bad value");
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (!check.types.count(family) && name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          check.types.count(name.substr(0, name.size() - s.size()))) {
        family = name.substr(0, name.size() - s.size());
      }
    }
    if (!check.types.count(family)) {
      fail("sample without a # TYPE");
      continue;
    }
    if (check.types[family] != "histogram") continue;
    const double v = std::strtod(value.c_str(), nullptr);
    if (name == family + "_bucket") {
      const std::string labels = m[3];
      std::smatch le;
      if (!std::regex_search(labels, le, kLe)) {
        fail("bucket without le");
        continue;
      }
      if (v < last_bucket[family]) fail("buckets not cumulative");
      last_bucket[family] = v;
      if (le[1] == "+Inf") inf_bucket[family] = v;
    } else if (name == family + "_count") {
      if (!inf_bucket.count(family) || inf_bucket[family] != v) fail("+Inf bucket != _count");
    }
  }
  return check;
}

}  // namespace kvl::testing
