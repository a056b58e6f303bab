// dissect/kernels/cpu_dispatch.hpp — which SIMD code path dissect's kernels run, chosen at run
// time.
//
// Programs are built for plain x86-64, so the kernels carry their own instruction-set targets
// (kernels/detail/simd_targets.hpp) and this header picks one from what the CPU (and the OS,
// for the AVX-512 register state) supports. The float GEMM (kernels/gemm.hpp) and the
// low-precision kernels (quant/kernel_path.hpp) both dispatch on it. Tests and benchmarks can pin
// a path for the whole process with force_kernel_path.
#pragma once

#include <array>
#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"

namespace dissect {

/// The code paths, from portable to most specialised. Each AVX-512 path implies avx512.
enum class KernelPath {
  scalar,       ///< plain loops, double accumulation: the oracle the tests compare against
  avx2,         ///< AVX2 + FMA + F16C: weights widened to fp32, fp32 activations
  avx512,       ///< AVX-512 F/BW/VL: weights widened to fp32, fp32 activations
  avx512_vnni,  ///< int8 / q4_0: activations quantised to int8 per 32, integer dot products
  avx512_bf16,  ///< bf16: activations rounded to bf16, bf16 dot products
};

// ---- declarations -------------------------------------------------------------------------------

/// "avx512_vnni"; "unknown" for a value outside the enum.
constexpr std::string_view kernel_path_name(KernelPath path);

/// Whether this CPU and OS can run `path`: scalar always; avx2 = AVX2 + FMA + F16C; avx512 =
/// AVX-512 F, BW, VL + AVX2, FMA, F16C; avx512_vnni and avx512_bf16 add their extension.
/// @throws ConfigError for a value outside the enum.
bool cpu_supports(KernelPath path);

/// Every path cpu_supports, in enum order (scalar first).
std::vector<KernelPath> supported_kernel_paths();

/// Pins every later dispatch in the process to `path` (nullopt: back to automatic choice).
/// Thread-safe. @throws ConfigError for a value outside the enum; Error naming the path when
/// the CPU lacks it. Either way nothing changes.
void force_kernel_path(std::optional<KernelPath> path);

/// The pinned path, if any.
std::optional<KernelPath> forced_kernel_path();

/// The CPU's model name as CPUID's brand string gives it ("AMD EPYC", "Intel(R) Xeon(R) …"),
/// spaces trimmed; "unknown" where there is none. Speed reports name the CPU they ran on, since
/// a kernel's speed is a property of the machine as much as of the code.
std::string cpu_model_name();

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline constexpr std::array<std::string_view, 5> kernel_path_names = {"scalar", "avx2", "avx512",
                                                                      "avx512_vnni", "avx512_bf16"};

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false;
};

/// GCC (since 12 for avx512vnni/avx512bf16) and Clang answer __builtin_cpu_supports from CPUID
/// and report AVX and AVX-512 features only when XGETBV shows the OS saves the ymm / zmm state
/// (libgcc's and compiler-rt's cpuinfo check XCR0 first), so no separate OS check is needed.
inline CpuFeatures detect_cpu() {
  CpuFeatures f;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#if defined(__clang__)
  // Clang (14, Debian 12's) knows no "f16c" for __builtin_cpu_supports: CPUID leaf 1's ECX bit
  // 29, usable only where the OS saves the ymm state (which "avx" includes, as above).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
#else
  f.f16c = __builtin_cpu_supports("f16c");
#endif
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu();
  return features;
}

inline std::string cpu_brand_string() {
  std::string brand;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  unsigned regs[4] = {};
  if (__get_cpuid(0x80000000u, &regs[0], &regs[1], &regs[2], &regs[3]) && regs[0] >= 0x80000004u) {
    for (unsigned leaf = 0x80000002u; leaf <= 0x80000004u; ++leaf) {
      __get_cpuid(leaf, &regs[0], &regs[1], &regs[2], &regs[3]);
      for (unsigned r : regs) {
        for (int byte = 0; byte < 4; ++byte) brand.push_back(static_cast<char>(r >> (8 * byte)));
      }
    }
  }
#endif
  brand = brand.substr(0, brand.find('\0'));
  const auto first = brand.find_first_not_of(' ');
  if (first == std::string::npos) return "unknown";
  return brand.substr(first, brand.find_last_not_of(' ') - first + 1);
}

inline KernelPath check_path(std::string_view op, KernelPath path) {
  return check_enum(op, "KernelPath", path, kernel_path_names);
}

/// -1: nothing pinned; otherwise the KernelPath's value. One slot for the whole program (an
/// inline function's static is shared by every translation unit).
inline std::atomic<int>& forced_path_slot() {
  static std::atomic<int> slot{-1};
  return slot;
}

}  // namespace detail

constexpr std::string_view kernel_path_name(KernelPath path) {
  return detail::enum_name(path, detail::kernel_path_names);
}

inline bool cpu_supports(KernelPath path) {
  const auto& f = detail::cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl;
  switch (detail::check_path("cpu_supports", path)) {
    case KernelPath::scalar:
      return true;
    case KernelPath::avx2:
      return avx2;
    case KernelPath::avx512:
      return avx512;
    case KernelPath::avx512_vnni:
      return avx512 && f.avx512vnni;
    case KernelPath::avx512_bf16:
      return avx512 && f.avx512bf16;
  }
  return false;
}

inline std::vector<KernelPath> supported_kernel_paths() {
  std::vector<KernelPath> paths;
  for (std::size_t i = 0; i < detail::kernel_path_names.size(); ++i) {
    const auto path = static_cast<KernelPath>(i);
    if (cpu_supports(path)) paths.push_back(path);
  }
  return paths;
}

inline void force_kernel_path(std::optional<KernelPath> path) {
  if (path) {
    detail::check_path("force_kernel_path", *path);
    if (!cpu_supports(*path)) {
      throw Error(detail::concat("force_kernel_path: this CPU cannot run the ",
                                 kernel_path_name(*path), " path"));
    }
  }
  detail::forced_path_slot().store(path ? static_cast<int>(*path) : -1, std::memory_order_release);
}

inline std::optional<KernelPath> forced_kernel_path() {
  const int raw = detail::forced_path_slot().load(std::memory_order_acquire);
  if (raw < 0) return std::nullopt;
  return static_cast<KernelPath>(raw);
}

inline std::string cpu_model_name() {
  static const std::string name = detail::cpu_brand_string();
  return name;
}

}  // namespace dissect
