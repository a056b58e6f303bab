// The translation unit that builds the tests' shared precompiled header (tests/CMakeLists.txt,
// DISSECT_TEST_PCH); it compiles nothing of its own.
