// tests/support/counting_new.cpp — the replaced global operator new and delete behind
// allocation_count() (support/allocation_counter.hpp). Replacing them is program-wide, so this is
// one file, linked only into the binaries whose tests count allocations.
#include <atomic>
#include <cstdlib>
#include <new>

#include "support/allocation_counter.hpp"

namespace {
std::atomic<long> allocations{0};

void* counted_malloc(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}

void* counted_aligned_alloc(std::size_t size, std::align_val_t alignment) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto align = static_cast<std::size_t>(alignment);
  // aligned_alloc wants a multiple of the alignment, and a non-zero size.
  if (void* p = std::aligned_alloc(align, (size + align - 1) / align * align + align)) return p;
  throw std::bad_alloc();
}
}  // namespace

long dissect::testing::allocation_count() {
  return allocations.load(std::memory_order_relaxed);
}

// malloc and free behind new and delete: GCC's -Wmismatched-new-delete cannot see they pair.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  return counted_malloc(size);
}
void* operator new[](std::size_t size) {
  return counted_malloc(size);
}
void* operator new(std::size_t size, std::align_val_t alignment) {
  return counted_aligned_alloc(size, alignment);
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return counted_aligned_alloc(size, alignment);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
