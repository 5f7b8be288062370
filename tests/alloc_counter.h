// Test-only heap allocation counter, for the "zero heap allocation in the per-token step" rule
// (STYLE.md). It replaces the global operator new / delete, so it counts every allocation on every
// thread (thread-pool workers included) while armed.
//
// Usage: exactly one .cc of a test binary (tests/<layer>/*.cc all link into test_<layer>) says
//   KVL_ALLOC_COUNTER_HOOKS()
// at global scope; a second one is a duplicate-symbol link error. Any test of that binary then
// measures a region with
//   kvl::testing::AllocCounter counter;   // armed from here
//   ... the step under test ...
//   const int64_t n = counter.Stop();     // allocations since construction
// Keep gtest assertions out of the armed region, since they may allocate.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

namespace kvl::testing {
namespace alloc_counter_internal {

// Constant-initialized, so usable by allocations made before main.
inline std::atomic<bool> hooks_installed{false};
inline std::atomic<bool> armed{false};
inline std::atomic<int64_t> count{0};

inline void Note() {
  if (armed.load(std::memory_order_relaxed)) count.fetch_add(1, std::memory_order_relaxed);
}

inline void* Allocate(std::size_t n) {
  Note();
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

inline void* AllocateAligned(std::size_t n, std::align_val_t align) {
  Note();
  const std::size_t a = static_cast<std::size_t>(align);
  // aligned_alloc wants a size that is a multiple of the alignment.
  void* p = std::aligned_alloc(a, (n + a - 1) / a * a + (n == 0 ? a : 0));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// The nothrow forms: nullptr instead of std::bad_alloc.
inline void* AllocateNoThrow(std::size_t n) noexcept {
  try {
    return Allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
inline void* AllocateAlignedNoThrow(std::size_t n, std::align_val_t align) noexcept {
  try {
    return AllocateAligned(n, align);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

// Set by KVL_ALLOC_COUNTER_HOOKS' static initializer: an AllocCounter without the hooks would
// count nothing and every zero-allocation test would pass without measuring.
struct HooksMarker {
  HooksMarker() { hooks_installed.store(true); }
};

}  // namespace alloc_counter_internal

// Counts heap allocations (operator new of any form, on any thread) from construction to Stop()
// or destruction. One armed counter at a time.
class AllocCounter {
 public:
  AllocCounter() {
    if (!alloc_counter_internal::hooks_installed.load()) {
      std::fprintf(stderr, "AllocCounter: KVL_ALLOC_COUNTER_HOOKS() is missing from this binary\n");
      std::abort();
    }
    alloc_counter_internal::count.store(0);
    alloc_counter_internal::armed.store(true);
  }
  ~AllocCounter() { alloc_counter_internal::armed.store(false); }
  AllocCounter(const AllocCounter&) = delete;
  AllocCounter& operator=(const AllocCounter&) = delete;

  // Disarms and returns the number of allocations seen.
  int64_t Stop() {
    alloc_counter_internal::armed.store(false);
    return alloc_counter_internal::count.load();
  }
};

}  // namespace kvl::testing

// The replaced global allocation functions; see the top of this file.
#define KVL_ALLOC_COUNTER_HOOKS()                                                            \
  static ::kvl::testing::alloc_counter_internal::HooksMarker kvl_alloc_counter_hooks_marker; \
  namespace kvl_alloc_counter = ::kvl::testing::alloc_counter_internal;                      \
  void* operator new(std::size_t n) { return kvl_alloc_counter::Allocate(n); }               \
  void* operator new[](std::size_t n) { return kvl_alloc_counter::Allocate(n); }             \
  void* operator new(std::size_t n, const std::nothrow_t&) noexcept {                        \
    return kvl_alloc_counter::AllocateNoThrow(n);                                            \
  }                                                                                          \
  void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {                      \
    return kvl_alloc_counter::AllocateNoThrow(n);                                            \
  }                                                                                          \
  void* operator new(std::size_t n, std::align_val_t a) {                                    \
    return kvl_alloc_counter::AllocateAligned(n, a);                                         \
  }                                                                                          \
  void* operator new[](std::size_t n, std::align_val_t a) {                                  \
    return kvl_alloc_counter::AllocateAligned(n, a);                                         \
  }                                                                                          \
  void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {    \
    return kvl_alloc_counter::AllocateAlignedNoThrow(n, a);                                  \
  }                                                                                          \
  void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {  \
    return kvl_alloc_counter::AllocateAlignedNoThrow(n, a);                                  \
  }                                                                                          \
  void operator delete(void* p) noexcept { std::free(p); }                                   \
  void operator delete[](void* p) noexcept { std::free(p); }                                 \
  void operator delete(void* p, std::size_t) noexcept { std::free(p); }                      \
  void operator delete[](void* p, std::size_t) noexcept { std::free(p); }                    \
  void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }            \
  void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }          \
  void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }                 \
  void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }               \
  void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }    \
  void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }  \
  void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {          \
    std::free(p);                                                                            \
  }                                                                                          \
  void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {        \
    std::free(p);                                                                            \
  }
