// dissect/layers/linear/detail/boxed.hpp — private: do not include directly
// (dissect/layers/linear.hpp includes it).
//
// Boxed<T>: an owning, copyable pointer to a T whose definition the including header does not
// need. Linear holds its optional parts this way (a LoRA adapter and its merge record, a quantised
// weight), so that linear.hpp neither includes their headers nor compiles their code in every
// unit that multiplies: copying and destroying go through two functions recorded where the box
// is filled, which is code that has T complete (the header of the mode that fills it).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/layers/linear/detail/boxed.hpp is private to dissect: include dissect/layers/linear.hpp instead"
#endif

#include <utility>

namespace dissect::detail {

template <class T>
class Boxed {
 public:
  Boxed() = default;
  /// Takes `value` into a new box. Instantiated only where T is complete.
  static Boxed make(T value) {
    Boxed box;
    box.value_ = new T(std::move(value));
    box.copy_ = [](const T& other) { return new T(other); };
    box.destroy_ = [](T* owned) { delete owned; };
    return box;
  }
  Boxed(const Boxed& other)
      : value_(other.value_ ? other.copy_(*other.value_) : nullptr),
        copy_(other.copy_),
        destroy_(other.destroy_) {}
  Boxed(Boxed&& other) noexcept
      : value_(std::exchange(other.value_, nullptr)),
        copy_(other.copy_),
        destroy_(other.destroy_) {}
  Boxed& operator=(Boxed other) noexcept {
    std::swap(value_, other.value_);
    std::swap(copy_, other.copy_);
    std::swap(destroy_, other.destroy_);
    return *this;
  }
  ~Boxed() { reset(); }

  void reset() noexcept {
    if (value_) destroy_(value_);
    value_ = nullptr;
  }
  T* get() const { return value_; }
  explicit operator bool() const { return value_ != nullptr; }

 private:
  T* value_ = nullptr;
  T* (*copy_)(const T&) = nullptr;
  void (*destroy_)(T*) = nullptr;
};

/// A pointer to the calls of the mode a layer's boxes hold, which moves out with them: a
/// moved-from layer's boxes are empty, so it must not keep calls that would reach into them.
template <class Calls>
class ModeCalls {
 public:
  ModeCalls() = default;
  ModeCalls(const Calls* calls) : calls_(calls) {}  // NOLINT: assigned from &calls and nullptr
  ModeCalls(const ModeCalls&) = default;
  ModeCalls(ModeCalls&& other) noexcept : calls_(std::exchange(other.calls_, nullptr)) {}
  ModeCalls& operator=(const ModeCalls&) = default;
  ModeCalls& operator=(ModeCalls&& other) noexcept {
    calls_ = std::exchange(other.calls_, nullptr);
    return *this;
  }
  const Calls* operator->() const { return calls_; }
  explicit operator bool() const { return calls_ != nullptr; }

 private:
  const Calls* calls_ = nullptr;
};

/// T, spelled so that it depends on D: a member of a class template whose parameter is a type the
/// header only declares (LoRAOptions, QuantizedWeight) is then checked where it is called, not
/// where the class is defined.
template <class T, class D>
struct dependent_type {
  using type = T;
};
template <class T, class D>
using dependent_t = typename dependent_type<T, D>::type;

/// Whether T is complete here: a Linear member that needs a mode's header checks it, so that a
/// unit calling it without the header stops at compile time with the header's name.
template <class T>
concept complete_type = requires {
  sizeof(T);
};

}  // namespace dissect::detail
