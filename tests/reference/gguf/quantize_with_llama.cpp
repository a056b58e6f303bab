// quantize_with_llama.cpp — quantises a GGUF model with llama.cpp's own llama_model_quantize
// (what its llama-quantize tool runs), to make reference files for dissect's quantiser: which
// type llama.cpp gives each tensor for a file type, and the bytes. Reference generation only;
// tests never run it (its outputs are committed).
//
// Usage: quantize_with_llama IN.gguf OUT.gguf FTYPE
//   FTYPE: q8_0 q4_0 q4_1 q5_0 q5_1 q4_k_s q4_k_m q5_k_s q5_k_m q6_k f16 bf16
// Quantisation runs on one thread, without an importance matrix, with llama.cpp's defaults
// otherwise (output.weight quantised too, llama.cpp's per-tensor type choices for the K mixes).
//
// Build: g++ -std=c++17 quantize_with_llama.cpp -L<libdir> -l:libllama.v0.5.0.so
//            -Wl,-rpath,<libdir> -o quantize_with_llama
// where <libdir> holds the prebuilt libraries of @node-llama-cpp/linux-x64@3.22.1
// (bins/linux-x64: libllama.v0.5.0.so, libggml.v0.5.0.so, libggml-base.so, libggml-cpu-*.so);
// libllama finds its libggml dependencies through its own $ORIGIN runpath.
//
// llama.h is not installed with those libraries, so the few declarations needed are written
// out below, from include/llama.h of the llama.cpp source the package was built from
// (node-llama-cpp@3.22.1's llama/gitRelease.bundle, release "v0.5.0").
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

extern "C" {

// enum llama_ftype, the values this program offers (llama.h: LLAMA_FTYPE_MOSTLY_*).
enum llama_ftype : int32_t {
  LLAMA_FTYPE_MOSTLY_F16 = 1,
  LLAMA_FTYPE_MOSTLY_Q4_0 = 2,
  LLAMA_FTYPE_MOSTLY_Q4_1 = 3,
  LLAMA_FTYPE_MOSTLY_Q8_0 = 7,
  LLAMA_FTYPE_MOSTLY_Q5_0 = 8,
  LLAMA_FTYPE_MOSTLY_Q5_1 = 9,
  LLAMA_FTYPE_MOSTLY_Q4_K_S = 14,
  LLAMA_FTYPE_MOSTLY_Q4_K_M = 15,
  LLAMA_FTYPE_MOSTLY_Q5_K_S = 16,
  LLAMA_FTYPE_MOSTLY_Q5_K_M = 17,
  LLAMA_FTYPE_MOSTLY_Q6_K = 18,
  LLAMA_FTYPE_MOSTLY_BF16 = 32,
};

// struct llama_model_quantize_params, field for field as in that llama.h (64 bytes on x86-64).
// The enum fields (llama_ftype, ggml_type) are C enums, i.e. int-sized. Only nthread and
// ftype are changed here; the rest keep llama_model_quantize_default_params()'s values.
struct llama_model_quantize_params {
  int32_t nthread;               // threads; <= 0 means std::thread::hardware_concurrency()
  int32_t ftype;                 // enum llama_ftype
  int32_t output_tensor_type;    // enum ggml_type; GGML_TYPE_COUNT = let ftype decide
  int32_t token_embedding_type;  // enum ggml_type; GGML_TYPE_COUNT = let ftype decide
  bool allow_requantize;         // allow quantizing non-f32/f16 tensors
  bool quantize_output_tensor;   // quantize output.weight
  bool only_copy;                // only copy tensors
  bool pure;                     // quantize all tensors to ftype's default type
  bool keep_split;               // quantize to the same number of shards
  bool dry_run;                  // only report the resulting size
  const void* imatrix;           // const struct llama_model_imatrix_data*
  const void* kv_overrides;      // const struct llama_model_kv_override*
  const void* tt_overrides;      // const struct llama_model_tensor_override*
  const int32_t* prune_layers;   // layer indices to prune
  size_t max_buf_size;           // bytes of tensor rows kept in memory at once, 0 = default
};

void llama_backend_init(void);
void llama_backend_free(void);
llama_model_quantize_params llama_model_quantize_default_params(void);
uint32_t llama_model_quantize(const char* fname_inp, const char* fname_out,
                              const llama_model_quantize_params* params);
}

// The layout the library uses: llama_model_quantize_default_params in libllama.v0.5.0.so
// (disassembled) writes exactly 64 bytes through its hidden return pointer, with ftype 7 at
// offset 4, GGML_TYPE_COUNT (43) at 8 and 12, quantize_output_tensor = 1 at 17, null pointers
// at 24..55 and max_buf_size = 8 GiB at 56. These keep the declaration above on it.
static_assert(sizeof(llama_model_quantize_params) == 64, "llama_model_quantize_params layout");
static_assert(offsetof(llama_model_quantize_params, allow_requantize) == 16, "bool fields");
static_assert(offsetof(llama_model_quantize_params, imatrix) == 24, "pointer fields");
static_assert(offsetof(llama_model_quantize_params, max_buf_size) == 56, "max_buf_size");

namespace {

struct FtypeName {
  const char* name;
  llama_ftype ftype;
};

const FtypeName kFtypes[] = {
    {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
    {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},     {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
    {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},     {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S},
    {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S},
    {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
    {"f16", LLAMA_FTYPE_MOSTLY_F16},       {"bf16", LLAMA_FTYPE_MOSTLY_BF16},
};

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s IN.gguf OUT.gguf FTYPE\n  FTYPE:", argv0);
  for (const FtypeName& f : kFtypes) std::fprintf(stderr, " %s", f.name);
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return usage(argv[0]);
  const FtypeName* chosen = nullptr;
  for (const FtypeName& f : kFtypes)
    if (std::strcmp(argv[3], f.name) == 0) chosen = &f;
  if (chosen == nullptr) return usage(argv[0]);

  // Loads the ggml backends (libggml-cpu-*.so next to libggml) and initialises ggml's tables,
  // as llama.cpp's own llama-quantize does before quantising.
  llama_backend_init();

  llama_model_quantize_params params = llama_model_quantize_default_params();
  params.nthread = 1;  // rows are quantised independently, so this changes only the speed
  params.ftype = chosen->ftype;

  const uint32_t status = llama_model_quantize(argv[1], argv[2], &params);
  llama_backend_free();
  if (status != 0) {
    std::fprintf(stderr, "llama_model_quantize(%s -> %s, %s) failed (%u)\n", argv[1], argv[2],
                 chosen->name, status);
    return 1;
  }
  std::printf("%s -> %s (%s, llama_ftype %d)\n", argv[1], argv[2], chosen->name,
              static_cast<int>(chosen->ftype));
  return 0;
}
