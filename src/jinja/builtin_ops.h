// Helpers shared by the filters (builtins.cc) and the methods (methods.cc).
#pragma once

#include <string>

#include "interpreter.h"

namespace kvl::jinja {

// /\b\w/g upper-cased: ASCII word starts only, the rest left as it is (the reference's title).
std::string TitleCase(const std::string& s);
// The first character upper-cased, the rest left as it is (the reference's capitalize).
std::string Capitalize(const std::string& s);
// str.replace(old, new[, count]) with count also as a keyword.
Value ReplaceMethod(Interpreter& in, const std::string& s, const CallArgs& args);
// d.items() / d.keys() / d.values() as lists.
Value MappingView(const Value& object, const std::string& which);
// d.dictsort(case_sensitive=false, by='key', reverse=false).
Value DictSort(const Value& object, const CallArgs& args);
// How Array.prototype.join prints one item: none and undefined as nothing.
std::string JoinPart(const Value& v);

}  // namespace kvl::jinja
