// A Jinja interpreter for chat templates: parse a template once, render it with named values.
//
// It renders what @huggingface/jinja renders, byte for byte, since that is the reference HF
// transformers' chat templates are written and tested against: the same whitespace handling
// (trim_blocks and lstrip_blocks on, `{%-`/`-%}`, one trailing newline dropped), the same
// statements (if/elif/else, for with loop.* and else, break/continue, set and block set,
// macro and call, filter blocks), expressions, filters, tests, string and mapping methods,
// `tojson` and `raise_exception`. Where the reference throws, this throws too (a Status naming
// the construct and its line), with one exception: what real templates use that the reference
// lacks (test arguments, select/reject/min/max/sum/round/format filters, str.format/join/count/
// find) renders as Python's Jinja renders it.
//
// Parsing and rendering are bounded, so that no template (a GGUF's is untrusted input) can
// crash, hang or exhaust the process: a template's operator chains and nesting are limited at
// parse; a render has a step budget in which work on large values weighs by its size, a budget
// of bytes for everything it holds at once, a per-string limit, a recursion limit and a
// deadline. Each is an error naming it, never a crash, and no value however deep is printed,
// compared or freed by unbounded recursion.
//
// A parsed Template is immutable and may be rendered from several threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvl/jinja_value.h"
#include "kvl/status.h"

namespace kvl::jinja {

struct Program;  // the parsed template; private to the library

struct RenderOptions {
  // Steps before the render is stopped: one for each statement, expression and loop iteration,
  // and one for each KiB of data a filter, method, operator or print reads or writes, so that
  // a loop over large strings stops as soon as a loop of many small steps does.
  int64_t max_steps = 2'000'000;
  // Nested macro calls before the render is stopped (recursion).
  int max_call_depth = 128;
  // Bytes any one string (the output included) may reach.
  size_t max_string_bytes = size_t{16} << 20;
  // Bytes the render may hold at once: every string, list and mapping it made that is still
  // alive, and the text it has written, together.
  size_t max_bytes = size_t{128} << 20;
  // Seconds of wall-clock time before the render is stopped, whatever is left of its steps (a
  // machine too loaded to finish them in time); 0: no deadline.
  double max_seconds = 10;
  // Where set, the render stops at its next check once this turns true (a server shutting down).
  const std::atomic<bool>* cancel = nullptr;
  // The time strftime_now() formats; 0 reads the clock (local time, as the reference does).
  std::time_t now = 0;
};

using Context = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // INVALID_ARGUMENT naming the line and the construct for a template that does not parse
  // (an unbalanced block, an unknown statement, a bad token, an operator chain longer or a
  // nesting deeper than the limits).
  static StatusOr<Template> Parse(std::string_view source);

  // The template rendered with `context` (messages, add_generation_prompt, bos_token, ...).
  // INVALID_ARGUMENT naming the line and the cause for an error the template raises or hits
  // (raise_exception, an unknown filter or test, a type error) or a limit it passes.
  StatusOr<std::string> Render(const Context& context, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace kvl::jinja
