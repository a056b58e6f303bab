// Must not compile: the library's shared private helpers are reachable only through a public
// header.
#include <dissect/core/detail/enum_check.hpp>
int main() {}
