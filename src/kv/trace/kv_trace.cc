#include "kvl/kv_trace.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "kvl/user_file.h"

namespace kvl {
namespace {

constexpr std::string_view kMagic = "kvl-trace";
constexpr int kVersion = 1;
// A trace is read whole; this bounds what `kvl bench replay` will load.
constexpr int64_t kMaxTraceBytes = 1ll << 30;

constexpr std::string_view kCauseNames[] = {"relief", "preempt", "reuse"};

// The words of one line, split on single spaces.
std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t start = 0;
  while (start <= line.size()) {
    const size_t end = std::min(line.find(' ', start), line.size());
    words.push_back(line.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return !text.empty() && ec == std::errc() && ptr == end;
}

bool ParseContent(std::string_view text, KvContentId* id) {
  if (text == "-") {
    *id = {};
    return true;
  }
  if (text.size() != 32) return false;
  uint64_t hi = 0, lo = 0;
  const auto r1 = std::from_chars(text.data(), text.data() + 16, hi, 16);
  const auto r2 = std::from_chars(text.data() + 16, text.data() + 32, lo, 16);
  if (r1.ec != std::errc() || r1.ptr != text.data() + 16 || r2.ec != std::errc() ||
      r2.ptr != text.data() + 32) {
    return false;
  }
  *id = {lo, hi};
  return id->valid();
}

// Ascending blocks as "3,5-9", or "-" for none.
void AppendBlockList(std::span<const int64_t> blocks, std::string* out) {
  if (blocks.empty()) {
    out->push_back('-');
    return;
  }
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1) ++j;
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{}", blocks[i]);
    if (j > i) fmt::format_to(std::back_inserter(*out), "-{}", blocks[j]);
    i = j + 1;
  }
}

// The inverse of AppendBlockList: ascending blocks, each below `count`.
bool ParseBlockList(std::string_view text, int64_t count, std::vector<int64_t>* blocks) {
  blocks->clear();
  if (text == "-") return true;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, end - start);
    const size_t dash = item.find('-');
    int64_t first = 0, last = 0;
    if (dash == std::string_view::npos) {
      if (!ParseNumber(item, &first)) return false;
      last = first;
    } else if (!ParseNumber(item.substr(0, dash), &first) ||
               !ParseNumber(item.substr(dash + 1), &last) || last < first) {
      return false;
    }
    if (first < 0 || last >= count || (!blocks->empty() && first <= blocks->back())) return false;
    for (int64_t b = first; b <= last; ++b) blocks->push_back(b);
    start = end + 1;
  }
  return true;
}

int ParseAction(std::string_view name) {
  for (int a = 0; a <= kKvTracePoolReuse; ++a) {
    if (KvTraceActionName(a) == name) return a;
  }
  return -1;
}

}  // namespace

std::string_view KvTraceActionName(int action) {
  if (action == kKvTracePoolReuse) return "pool-reuse";
  if (action < 0 || action > kKvTracePoolReuse) return "?";
  return KvActionName(static_cast<KvAction>(action));
}

std::string_view KvTraceCauseName(KvTraceCause cause) {
  return kCauseNames[static_cast<size_t>(cause)];
}

StatusOr<std::unique_ptr<KvTraceWriter>> KvTraceWriter::Open(const std::string& path,
                                                             const KvTraceHeader& header) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return IoError(fmt::format("--kv-trace {}: cannot create it: {}", path, std::strerror(errno)));
  }
  std::unique_ptr<KvTraceWriter> w(new KvTraceWriter(file, path));
  std::string prices;
  for (double p : header.price_ms) {
    if (!prices.empty()) prices += ',';
    prices += p < 0 ? std::string("-") : fmt::format("{:.6g}", p);
  }
  w->line_ = fmt::format(
      "{} {} block_tokens={} pool_blocks={} sink_tokens={} recent_tokens={} price_ms={}\n", kMagic,
      kVersion, header.block_tokens, header.pool_blocks, header.sink_tokens, header.recent_tokens,
      prices);
  w->Line(w->line_.data(), w->line_.size());
  return w;
}

StatusOr<std::unique_ptr<KvTraceRecorder>> OpenKvTraceFile(const std::string& path,
                                                           const KvTraceHeader& header) {
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTraceWriter> writer, KvTraceWriter::Open(path, header));
  return std::unique_ptr<KvTraceRecorder>(std::move(writer));
}

KvTraceWriter::~KvTraceWriter() { (void)Close(); }

void KvTraceWriter::Line(const char* text, size_t n) {
  if (file_ != nullptr && std::fwrite(text, 1, n, file_) != n && error_ == 0) {
    error_ = errno != 0 ? errno : EIO;
  }
}

Status KvTraceWriter::Close() {
  if (file_ == nullptr) return Status::Ok();
  if (std::fclose(file_) != 0 && error_ == 0) error_ = errno != 0 ? errno : EIO;
  file_ = nullptr;
  if (error_ != 0) {
    return IoError(fmt::format("--kv-trace {}: write failed: {}", path_, std::strerror(error_)));
  }
  return Status::Ok();
}

void KvTraceWriter::Step() {
  ++step_;
  line_.clear();
  fmt::format_to(std::back_inserter(line_), "S {}\n", step_);
  Line(line_.data(), line_.size());
}

int64_t KvTraceWriter::PageOf(int64_t request, int64_t block) const {
  const auto it = pages_of_request_.find(request);
  if (it == pages_of_request_.end() || block < 0 ||
      static_cast<size_t>(block) >= it->second.size()) {
    return -1;
  }
  return it->second[static_cast<size_t>(block)];
}

void KvTraceWriter::Read(int64_t request, std::span<const KvContentId> contents,
                         int64_t computed_from, std::span<const int64_t> outside,
                         std::span<const int64_t> evicted, int64_t steps_left) {
  std::vector<int64_t>& pages = pages_of_request_[request];
  line_.clear();
  for (size_t b = pages.size(); b < contents.size(); ++b) {
    const KvContentId id = contents[b];
    int64_t page = -1;
    if (id.valid()) {
      const auto [it, added] = page_of_content_.try_emplace({id.hi, id.lo}, num_pages_);
      page = it->second;
      if (added) ++num_pages_;
    } else {
      page = num_pages_++;
    }
    pages.push_back(page);
    if (id.valid()) {
      fmt::format_to(std::back_inserter(line_), "P {} {} {} {:016x}{:016x}\n", page, request, b,
                     id.hi, id.lo);
    } else {
      fmt::format_to(std::back_inserter(line_), "P {} {} {} -\n", page, request, b);
    }
  }
  fmt::format_to(std::back_inserter(line_), "R {} {} {} ", request, contents.size(), computed_from);
  AppendBlockList(outside, &line_);
  line_.push_back(' ');
  AppendBlockList(evicted, &line_);
  if (steps_left >= 0) {
    fmt::format_to(std::back_inserter(line_), " {}", steps_left);
  } else {
    line_ += " -";
  }
  line_.push_back('\n');
  Line(line_.data(), line_.size());
}

void KvTraceWriter::Leave(int64_t request, int64_t block, int action, KvTraceCause cause,
                          double predicted_ms) {
  const int64_t page = PageOf(request, block);
  if (page < 0) return;
  line_.clear();
  fmt::format_to(std::back_inserter(line_), "L {} {} {} {} {:.6g}\n", page, request,
                 KvTraceActionName(action), KvTraceCauseName(cause), predicted_ms);
  Line(line_.data(), line_.size());
}

void KvTraceWriter::LeaveReused(KvContentId content) {
  if (!content.valid()) return;
  const auto it = page_of_content_.find({content.hi, content.lo});
  if (it == page_of_content_.end()) return;
  line_.clear();
  fmt::format_to(std::back_inserter(line_), "L {} -1 {} {} 0\n", it->second,
                 KvTraceActionName(kKvTracePoolReuse), KvTraceCauseName(KvTraceCause::kReuse));
  Line(line_.data(), line_.size());
}

void KvTraceWriter::Back(int64_t request, int64_t block, int action, double predicted_ms,
                         double measured_ms) {
  const int64_t page = PageOf(request, block);
  if (page < 0) return;
  line_.clear();
  fmt::format_to(std::back_inserter(line_), "B {} {} {:.6g} {:.6g}\n", page,
                 KvTraceActionName(action), predicted_ms, measured_ms);
  Line(line_.data(), line_.size());
}

StatusOr<KvTrace> ParseKvTrace(std::string_view text) {
  KvTrace trace;
  // (request, block) -> page, to check that reads name known pages.
  std::unordered_map<int64_t, std::vector<int64_t>> pages_of_request;
  int64_t line_no = 0;
  size_t pos = 0;
  auto bad = [&](std::string_view line, std::string_view why) {
    return InvalidArgumentError(
        fmt::format("trace line {}: {}: '{}'", line_no, why, line.substr(0, 120)));
  };
  bool have_header = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const std::vector<std::string_view> w = Words(line);
    if (!have_header) {
      int version = 0;
      if (w.size() < 2 || w[0] != kMagic || !ParseNumber(w[1], &version)) {
        return bad(line, "not a kvl trace (no 'kvl-trace 1' header)");
      }
      if (version != kVersion)
        return bad(line, fmt::format("version {} (this reads {})", version, kVersion));
      for (size_t i = 2; i < w.size(); ++i) {
        const size_t eq = w[i].find('=');
        if (eq == std::string_view::npos) return bad(line, "a header field without '='");
        const std::string_view key = w[i].substr(0, eq), value = w[i].substr(eq + 1);
        KvTraceHeader& h = trace.header;
        bool ok = true;
        if (key == "block_tokens") {
          ok = ParseNumber(value, &h.block_tokens) && h.block_tokens > 0;
        } else if (key == "pool_blocks") {
          ok = ParseNumber(value, &h.pool_blocks) && h.pool_blocks >= 0;
        } else if (key == "sink_tokens") {
          ok = ParseNumber(value, &h.sink_tokens) && h.sink_tokens >= 0;
        } else if (key == "recent_tokens") {
          ok = ParseNumber(value, &h.recent_tokens) && h.recent_tokens >= 0;
        } else if (key == "price_ms") {
          const std::vector<std::string_view> prices = [&] {
            std::vector<std::string_view> out;
            size_t s = 0;
            while (s <= value.size()) {
              const size_t e = std::min(value.find(',', s), value.size());
              out.push_back(value.substr(s, e - s));
              s = e + 1;
            }
            return out;
          }();
          ok = prices.size() >= kKvTraceOldestPriceCount && prices.size() <= h.price_ms.size();
          for (size_t a = 0; ok && a < prices.size(); ++a) {
            if (prices[a] == "-") {
              h.price_ms[a] = -1;
            } else {
              ok = ParseNumber(prices[a], &h.price_ms[a]) && h.price_ms[a] >= 0;
            }
          }
        }  // other keys: written by a later version, ignored
        if (!ok) return bad(line, fmt::format("bad header field '{}'", key));
      }
      have_header = true;
      continue;
    }
    KvTraceEvent ev;
    const std::string_view kind = w[0];
    bool ok = true;
    if (kind == "S" && w.size() == 2) {
      ev.kind = KvTraceEvent::Kind::kStep;
      ok = ParseNumber(w[1], &ev.step);
    } else if (kind == "P" && w.size() == 5) {
      ev.kind = KvTraceEvent::Kind::kPage;
      ok = ParseNumber(w[1], &ev.page) && ParseNumber(w[2], &ev.request) &&
           ParseNumber(w[3], &ev.block) && ParseContent(w[4], &ev.content) && ev.page >= 0 &&
           ev.page <= trace.num_pages && ev.block >= 0;
      if (ok) {
        std::vector<int64_t>& pages = pages_of_request[ev.request];
        if (static_cast<size_t>(ev.block) != pages.size()) {
          return bad(line, "a page named out of order (blocks are named 0, 1, 2, ...)");
        }
        pages.push_back(ev.page);
        if (ev.page == trace.num_pages) ++trace.num_pages;
      }
    } else if (kind == "R" && (w.size() == 4 || w.size() == 6 || w.size() == 7)) {
      ev.kind = KvTraceEvent::Kind::kRead;
      ok = ParseNumber(w[1], &ev.request) && ParseNumber(w[2], &ev.block) &&
           ParseNumber(w[3], &ev.from) && ev.block >= 0 && ev.from >= 0;
      if (ok && w.size() >= 6) {
        ok = ParseBlockList(w[4], ev.block, &ev.outside) &&
             ParseBlockList(w[5], ev.block, &ev.evicted);
      }
      if (ok && w.size() == 7 && w[6] != "-") {
        ok = ParseNumber(w[6], &ev.steps_left) && ev.steps_left >= 0;
      }
      if (ok) {
        const auto it = pages_of_request.find(ev.request);
        const size_t named = it == pages_of_request.end() ? 0 : it->second.size();
        if (static_cast<size_t>(ev.block) > named) return bad(line, "a read of pages never named");
      }
    } else if (kind == "L" && w.size() == 6) {
      ev.kind = KvTraceEvent::Kind::kLeave;
      ev.action = ParseAction(w[3]);
      ok = ParseNumber(w[1], &ev.page) && ev.page >= 0 && ev.page < trace.num_pages &&
           ParseNumber(w[2], &ev.request) && ev.action >= 0 && ParseNumber(w[5], &ev.predicted_ms);
      bool known_cause = false;
      for (size_t c = 0; c < std::size(kCauseNames); ++c) {
        if (w[4] == kCauseNames[c]) {
          ev.cause = static_cast<KvTraceCause>(c);
          known_cause = true;
        }
      }
      ok = ok && known_cause;
    } else if (kind == "B" && w.size() == 5) {
      ev.kind = KvTraceEvent::Kind::kBack;
      ev.action = ParseAction(w[2]);
      ok = ParseNumber(w[1], &ev.page) && ev.page >= 0 && ev.page < trace.num_pages &&
           ev.action >= 0 && ParseNumber(w[3], &ev.predicted_ms) &&
           ParseNumber(w[4], &ev.measured_ms);
    } else {
      return bad(line, "an unknown event or the wrong number of fields");
    }
    if (!ok) return bad(line, "a field out of range or not a number");
    trace.events.push_back(ev);
  }
  if (!have_header) return InvalidArgumentError("the trace is empty (no 'kvl-trace 1' header)");
  return trace;
}

StatusOr<KvTrace> ReadKvTrace(const std::string& path) {
  KVL_ASSIGN_OR_RETURN(const std::string text, ReadUserFile(path, "trace", kMaxTraceBytes));
  StatusOr<KvTrace> trace = ParseKvTrace(text);
  if (!trace.ok())
    return InvalidArgumentError(fmt::format("{}: {}", path, trace.status().message()));
  return trace;
}

}  // namespace kvl
