#include "ast.h"

#include <utility>

namespace kvl::jinja {
namespace {

// Moves the children of `node` onto `pending`, leaving it with none.
void TakeChildren(Node& node, std::vector<std::unique_ptr<Node>>* pending) {
  for (std::unique_ptr<Node>* child : {&node.a, &node.b, &node.c}) {
    if (*child) pending->push_back(std::move(*child));
  }
  for (auto* list : {&node.args, &node.body, &node.alternate}) {
    for (std::unique_ptr<Node>& child : *list) {
      if (child) pending->push_back(std::move(child));
    }
    list->clear();
  }
}

}  // namespace

Node::~Node() {
  std::vector<std::unique_ptr<Node>> pending;
  TakeChildren(*this, &pending);
  while (!pending.empty()) {
    std::unique_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    TakeChildren(*node, &pending);
    // `node` is freed here with no children left, so its own destructor goes no deeper.
  }
}

const Node* FindNodeDeeperThan(const std::vector<std::unique_ptr<Node>>& body, int max_depth) {
  std::vector<std::pair<const Node*, int>> stack;
  for (const auto& statement : body) {
    if (statement) stack.emplace_back(statement.get(), 1);
  }
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (depth > max_depth) return node;
    for (const Node* child : {node->a.get(), node->b.get(), node->c.get()}) {
      if (child != nullptr) stack.emplace_back(child, depth + 1);
    }
    for (const auto* list : {&node->args, &node->body, &node->alternate}) {
      for (const auto& child : *list) {
        if (child) stack.emplace_back(child.get(), depth + 1);
      }
    }
  }
  return nullptr;
}

}  // namespace kvl::jinja
