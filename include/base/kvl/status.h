// Status and StatusOr: the error channel for everything a user, a file or a peer can cause.
// Invariants (programmer errors) use KVL_CHECK instead, which aborts with a message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace kvl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // a bad flag, request or parameter
  kNotFound,          // a missing file, key or tensor
  kOutOfRange,        // a read or index past the end of something
  kDataLoss,          // a malformed or corrupt file / page
  kUnimplemented,     // a valid input we do not support (yet)
  kResourceExhausted, // out of blocks, budget, memory
  kIoError,           // the OS said no
  kInternal,
  kCancelled,         // stopped at the caller's request before it finished
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DATA_LOSS: tensor 'blk.0.attn_q.weight': data ends past the end of the file".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(value_).ok()) value_ = Status(StatusCode::kInternal, "StatusOr from OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> value_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition, const char* message);

}  // namespace kvl

#define KVL_CONCAT_INNER(a, b) a##b
#define KVL_CONCAT(a, b) KVL_CONCAT_INNER(a, b)

#define KVL_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::kvl::Status kvl_status_ = (expr);      \
    if (!kvl_status_.ok()) return kvl_status_; \
  } while (0)

#define KVL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define KVL_ASSIGN_OR_RETURN(lhs, expr) \
  KVL_ASSIGN_OR_RETURN_IMPL(KVL_CONCAT(kvl_statusor_, __LINE__), lhs, expr)

// Invariants only: never for conditions a user or a file can cause.
#define KVL_CHECK(cond)                                                     \
  do {                                                                      \
    if (!(cond)) ::kvl::CheckFailed(__FILE__, __LINE__, #cond, nullptr);    \
  } while (0)
#define KVL_CHECK_MSG(cond, msg)                                            \
  do {                                                                      \
    if (!(cond)) ::kvl::CheckFailed(__FILE__, __LINE__, #cond, (msg));      \
  } while (0)
