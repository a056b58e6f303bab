// dissect/text/detail/function_ref.hpp — private: do not include directly
// (dissect/text/pre_tokenizer.hpp does).
//
// A non-owning reference to a callable, as std::function_ref (C++26) will be: the pre-tokenizers
// hand each piece to the next stage through one, with no allocation per piece.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/function_ref.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <memory>
#include <type_traits>
#include <utility>

namespace dissect::text::detail {

template <class Signature>
class FunctionRef;

template <class Result, class... Args>
class FunctionRef<Result(Args...)> {
 public:
  template <class Callable,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, FunctionRef>>>
  FunctionRef(Callable&& callable)  // NOLINT: implicit, as a function parameter takes a lambda
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        call_([](void* object, Args... args) -> Result {
          return (*static_cast<std::remove_reference_t<Callable>*>(object))(
              std::forward<Args>(args)...);
        }) {}

  Result operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  Result (*call_)(void*, Args...);
};

}  // namespace dissect::text::detail
