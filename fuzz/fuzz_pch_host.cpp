// fuzz/fuzz_pch_host.cpp — the translation unit that builds the io harnesses' shared
// precompiled header (fuzz/CMakeLists.txt); it holds no code of its own.
