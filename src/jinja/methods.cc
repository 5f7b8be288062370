// The methods and properties of strings, lists and mappings (`s.strip()`, `d.items()`,
// `l.length`) and the global functions, as the reference runtime defines them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "interpreter.h"
#include "js_text.h"
#include "builtin_ops.h"

namespace kvl::jinja {
namespace {

Value MakeFunction(std::string name, Callable::Fn fn, Value receiver = Value()) {
  return Value::Function(std::make_shared<Callable>(std::move(name), std::move(fn), std::move(receiver)));
}

// The arguments a method reads, with the reference's keyword-argument mapping appended last.
const Value& Arg(const CallArgs& args, size_t i) {
  static const Value kUndefined;
  return i < args.positional.size() ? args.positional[i] : kUndefined;
}

Value StartsOrEndsWith(const std::string& s, const CallArgs& args, bool start, const char* name) {
  if (args.positional.empty()) throw RenderError(fmt::format("{}() requires at least one argument", name));
  auto test = [&](const std::string& affix) {
    if (affix.size() > s.size()) return false;
    CountWork(affix.size());
    return start ? s.compare(0, affix.size(), affix) == 0 : s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
  };
  const Value& pattern = args.positional[0];
  if (pattern.is_string()) return Value::Bool(test(pattern.str()));
  if (pattern.is_array()) {
    for (const Value& item : pattern.items()) {
      if (!item.is_string()) throw RenderError(fmt::format("{}() tuple elements must be strings", name));
      if (test(item.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  throw RenderError(fmt::format("{}() argument must be a string or a tuple of strings", name));
}

// str.split(sep=None, maxsplit=-1), as the reference follows Python.
Value Split(const std::string& s, const CallArgs& args) {
  const Value sep = args.positional.empty() ? Value::Null() : args.positional[0];
  if (!sep.is_string() && !sep.is_null()) throw RenderError("split(): sep must be a string or none");
  const Value maxsplit_v = args.positional.size() > 1 ? args.positional[1] : Value::Int(-1);
  if (maxsplit_v.kind() != Value::Kind::kInt) throw RenderError("split(): maxsplit must be an integer");
  const double maxsplit = maxsplit_v.number();
  std::vector<Value> out;
  if (sep.is_null()) {
    const std::string_view text = TrimJs(s, true, false);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t word_end = pos, next = pos;
      while (word_end < text.size()) {
        next = word_end;
        if (IsJsSpace(NextCodePoint(text, &next))) break;
        word_end = next;
      }
      if (maxsplit != -1 && static_cast<double>(out.size()) >= maxsplit) {
        out.push_back(Value::String(std::string(text.substr(pos))));
        break;
      }
      out.push_back(Value::String(std::string(text.substr(pos, word_end - pos))));
      pos = word_end;
      while (pos < text.size()) {
        next = pos;
        if (!IsJsSpace(NextCodePoint(text, &next))) break;
        pos = next;
      }
    }
    return Value::Array(std::move(out));
  }
  const std::string& delimiter = sep.str();
  if (delimiter.empty()) throw RenderError("split(): empty separator");
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t found; (found = FindText(s, delimiter, start)) != std::string::npos; start = found + delimiter.size()) {
    parts.push_back(s.substr(start, found - start));
  }
  parts.push_back(s.substr(start));
  if (maxsplit != -1 && static_cast<double>(parts.size()) > maxsplit) {
    const size_t keep = static_cast<size_t>(std::max(0.0, maxsplit));
    std::string rest;
    for (size_t i = keep; i < parts.size(); ++i) rest += (i > keep ? delimiter : "") + parts[i];
    parts.resize(keep);
    parts.push_back(rest);
  }
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::Array(std::move(out));
}

// str.format(*args, **kwargs): {} / {0} / {name} fields and {{ }} escapes, each value printed
// as `{{ }}` prints it; format specs are refused. Beyond the reference (which has no format).
Value FormatMethod(Interpreter& in, const std::string& s, const CallArgs& args) {
  std::string out;
  size_t next_auto = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') throw RenderError("format(): single '}' in the format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) throw RenderError("format(): unclosed '{' in the format string");
    const std::string field = s.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) throw RenderError("format(): format specs are not supported");
    const Value* value = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = field.empty() ? next_auto++ : std::stoul(field.substr(0, 9));
      if (index < args.positional.size()) value = &args.positional[index];
    } else {
      value = args.keywords.Find(field);
    }
    if (value == nullptr) throw RenderError(fmt::format("format(): no argument for '{{{}}}'", field));
    out += Display(*value);
    in.CheckSize(out.size());
    i = close;
  }
  return Value::String(std::move(out));
}

// Code points before byte offset `bytes` of `s` (Python's str indices).
int64_t CodePointIndex(const std::string& s, size_t bytes) {
  int64_t n = 0;
  for (size_t pos = 0; pos < bytes;) {
    NextCodePoint(s, &pos);
    ++n;
  }
  return n;
}

Value StringMethod(const Value& object, const std::string& name) {
  const std::string& text = object.str();
  if (name == "length") return Value::Int(static_cast<double>(Utf16Length(text)));
  static const char* const kMethods[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip",
                                         "lstrip", "startswith", "endswith", "split", "replace",
                                         // Beyond the reference, as Python's str has them:
                                         "format", "join", "count", "find"};
  if (std::find(std::begin(kMethods), std::end(kMethods), name) == std::end(kMethods)) return Value();
  auto method = [name](Interpreter& in, const Value& receiver, CallArgs& args, Env&) -> Value {
    const std::string& s = receiver.str();
    if (name == "upper") return Value::String(AsciiUpper(s));
    if (name == "lower") return Value::String(AsciiLower(s));
    if (name == "strip") return Value::String(std::string(TrimJs(s, true, true)));
    if (name == "lstrip") return Value::String(std::string(TrimJs(s, true, false)));
    if (name == "rstrip") return Value::String(std::string(TrimJs(s, false, true)));
    if (name == "title") return Value::String(TitleCase(s));
    if (name == "capitalize") return Value::String(Capitalize(s));
    if (name == "startswith") return StartsOrEndsWith(s, args, true, "startswith");
    if (name == "endswith") return StartsOrEndsWith(s, args, false, "endswith");
    if (name == "split") return Split(s, args);
    if (name == "replace") return ReplaceMethod(in, s, args);
    if (name == "format") return FormatMethod(in, s, args);
    if (name == "join") {
      const Value& items = Arg(args, 0);
      if (!items.is_array()) throw RenderError("join() takes a list");
      std::string out;
      for (size_t i = 0; i < items.items().size(); ++i) {
        out += (i ? s : "") + JoinPart(items.items()[i]);
        in.CheckSize(out.size());
      }
      return Value::String(std::move(out));
    }
    const Value& needle = Arg(args, 0);
    if (!needle.is_string()) throw RenderError(fmt::format("{}() takes a string", name));
    if (name == "find") {
      const size_t at = FindText(s, needle.str());
      return Value::Int(at == std::string::npos ? -1 : static_cast<double>(CodePointIndex(s, at)));
    }
    if (needle.str().empty()) return Value::Int(static_cast<double>(CodePointIndex(s, s.size()) + 1));
    int64_t count = 0;
    for (size_t at = FindText(s, needle.str()); at != std::string::npos;
         at = FindText(s, needle.str(), at + needle.str().size())) {
      ++count;
    }
    return Value::Int(static_cast<double>(count));
  };
  return MakeFunction(name, std::move(method), object);
}

Value ObjectMethod(const Value& object, const std::string& name) {
  if (name == "get") {
    auto get = [](Interpreter&, const Value& mapping, CallArgs& args, Env&) -> Value {
      const Value& key = Arg(args, 0);
      if (!key.is_string()) throw RenderError(fmt::format("mapping key must be a string: got {}", key.TypeName()));
      if (const Value* found = mapping.map().Find(key.str())) return *found;
      return args.positional.size() > 1 ? args.positional[1] : Value::Null();
    };
    return MakeFunction(name, get, object);
  }
  if (name == "items" || name == "keys" || name == "values") {
    auto view = [name](Interpreter&, const Value& mapping, CallArgs&, Env&) { return MappingView(mapping, name); };
    return MakeFunction(name, view, object);
  }
  if (name == "dictsort") {
    auto sort = [](Interpreter&, const Value& mapping, CallArgs& args, Env&) { return DictSort(mapping, args); };
    return MakeFunction(name, sort, object);
  }
  return Value();
}

}  // namespace

Value MappingView(const Value& object, const std::string& which) {
  std::vector<Value> out;
  for (const auto& [key, value] : object.map().entries) {
    if (which == "items") {
      out.push_back(Value::Array({Value::String(key), value}));
    } else {
      out.push_back(which == "keys" ? Value::String(key) : value);
    }
  }
  return Value::Array(std::move(out));
}

Value DictSort(const Value& object, const CallArgs& args) {
  const Value* kw_case = args.keywords.Find("case_sensitive");
  const Value* kw_by = args.keywords.Find("by");
  const Value* kw_reverse = args.keywords.Find("reverse");
  const Value case_sensitive = args.positional.size() > 0 ? args.positional[0] : kw_case ? *kw_case : Value::Bool(false);
  const Value by = args.positional.size() > 1 ? args.positional[1] : kw_by ? *kw_by : Value::String("key");
  const Value reverse = args.positional.size() > 2 ? args.positional[2] : kw_reverse ? *kw_reverse : Value::Bool(false);
  if (!case_sensitive.is_bool()) throw RenderError("dictsort: case_sensitive must be a boolean");
  if (!by.is_string() || (by.str() != "key" && by.str() != "value")) {
    throw RenderError("dictsort: by must be 'key' or 'value'");
  }
  if (!reverse.is_bool()) throw RenderError("dictsort: reverse must be a boolean");
  std::vector<Value> items = MappingView(object, "items").items();
  const size_t index = by.str() == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = CompareValues(a.items()[index], b.items()[index], case_sensitive.boolean());
    return reverse.boolean() ? c > 0 : c < 0;
  });
  return Value::Array(std::move(items));
}

Value BuiltinMember(const Value& object, const std::string& name) {
  if (object.is_string()) return StringMethod(object, name);
  if (object.is_object()) return ObjectMethod(object, name);
  if (object.is_array() && name == "length") return Value::Int(static_cast<double>(object.items().size()));
  return Value();
}

namespace {

Value NamespaceFunction(Interpreter& in, const Value&, CallArgs& args, Env&) {
  if (args.positional.size() > 1) {
    throw RenderError(fmt::format("namespace expected at most 1 argument, got {}", args.positional.size()));
  }
  ValueMap entries;
  if (args.positional.size() == 1) {
    const Value& source = args.positional[0];
    if (source.is_object()) {
      for (const auto& [key, value] : source.map().entries) entries.Set(key, value);
    } else if (source.is_array()) {
      for (const Value& pair : source.items()) {
        std::vector<Value> kv;
        if (pair.is_array()) kv = pair.items();
        // A string is a pair of its two code points (of at most 4 bytes each).
        if (pair.is_string() && pair.str().size() <= 8) {
          for (std::string& c : SplitCodePoints(pair.str())) kv.push_back(Value::String(std::move(c)));
        }
        if (kv.size() != 2) throw RenderError("namespace expected a mapping or a list of [key, value] pairs");
        if (!kv[0].is_string()) throw RenderError("namespace keys must be strings");
        entries.Set(kv[0].str(), kv[1]);
      }
    } else {
      throw RenderError(fmt::format("'{}' object is not iterable", source.TypeName()));
    }
  }
  for (const auto& [key, value] : args.keywords.entries) entries.Set(key, value);
  Value ns = Value::Namespace(std::move(entries));
  in.TrackNamespace(ns);
  return ns;
}

// range() as the reference's utils.range over JavaScript numbers, refused past a million items
// (a template that asks for more is looping, not formatting a chat).
Value RangeFunction(Interpreter&, const Value&, CallArgs& args, Env&) {
  constexpr size_t kMaxItems = 1'000'000;
  auto number = [&](size_t i) -> double {
    const Value& v = args.positional[i];
    if (!v.is_number() && !v.is_bool()) throw RenderError(fmt::format("range() arguments must be numbers, got {}", v.TypeName()));
    return v.number();
  };
  if (args.positional.empty()) throw RenderError("range() expects at least 1 argument");
  double start = number(0), stop = 0, step = 1;
  if (args.positional.size() == 1) {
    stop = start, start = 0;
  } else {
    stop = number(1);
    if (args.positional.size() > 2) step = number(2);
  }
  if (step == 0) throw RenderError("range() step must not be zero");
  std::vector<Value> out;
  for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= kMaxItems) throw RenderError(fmt::format("range() of more than {} items", kMaxItems));
    out.push_back(std::floor(i) == i ? Value::Int(i) : Value::Float(i));
  }
  return Value::Array(std::move(out));
}

// strftime_now(format): the reference's minimal strftime (%Y %m %d %b %B %H %M %%, English
// month names, local time); any other directive is printed as it is.
Value StrftimeNow(Interpreter& in, const Value&, CallArgs& args, Env&) {
  if (args.positional.empty() || !args.positional[0].is_string()) {
    throw RenderError("strftime_now() expects a format string");
  }
  static const char* const kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                        "July",    "August",   "September", "October", "November", "December"};
  const std::time_t now = in.options().now != 0 ? in.options().now : std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  const std::string& format = args.positional[0].str();
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char d = format[i + 1];
    ++i;
    switch (d) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += fmt::format("{:02d}", tm.tm_mon + 1); break;
      case 'd': out += fmt::format("{:02d}", tm.tm_mday); break;
      case 'b': out += std::string(kMonths[tm.tm_mon]).substr(0, 3); break;
      case 'B': out += kMonths[tm.tm_mon]; break;
      case 'H': out += fmt::format("{:02d}", tm.tm_hour); break;
      case 'M': out += fmt::format("{:02d}", tm.tm_min); break;
      case '%': out += '%'; break;
      default: out += '%', out += d;
    }
  }
  return Value::String(std::move(out));
}

}  // namespace

void AddGlobals(Env& env) {
  env.Set("namespace", MakeFunction("namespace", NamespaceFunction));
  env.Set("range", MakeFunction("range", RangeFunction));
  env.Set("strftime_now", MakeFunction("strftime_now", StrftimeNow));
  env.Set("raise_exception", MakeFunction("raise_exception", [](Interpreter&, const Value&, CallArgs& args, Env&) -> Value {
            const Value message = args.positional.empty() ? Value() : args.positional[0];
            throw RenderError("raise_exception: " + (message.is_string() ? message.str() : RawString(message)));
          }));
  for (const char* name : {"true", "True"}) env.Set(name, Value::Bool(true));
  for (const char* name : {"false", "False"}) env.Set(name, Value::Bool(false));
  for (const char* name : {"none", "None"}) env.Set(name, Value::Null());
}

}  // namespace kvl::jinja
