#include <fmt/format.h>

#include <new>

#include "interpreter.h"
#include "kvl/jinja.h"
#include "lexer.h"
#include "parser.h"
#include "render_budget.h"

namespace kvl::jinja {

StatusOr<Template> Template::Parse(std::string_view source) {
  StatusOr<std::vector<Token>> tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  StatusOr<std::unique_ptr<Program>> program = jinja::Parse(std::move(*tokens));
  if (!program.ok()) return program.status();
  return Template(std::shared_ptr<const Program>(std::move(*program)));
}

StatusOr<std::string> Template::Render(const Context& context, const RenderOptions& options) const {
  RenderBudget budget(options);
  BudgetScope counting_against(&budget);
  try {
    Env global;
    AddGlobals(global);
    for (const auto& [name, value] : context) global.Set(name, value);
    Interpreter interpreter(options, budget);
    return interpreter.Run(*program_, global);
  } catch (const RenderError& e) {
    return InvalidArgumentError(e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("the template's render ran out of memory");
  }
}

}  // namespace kvl::jinja
