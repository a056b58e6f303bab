// make_block_fixture.cpp — writes blocks.gguf, the reference for dissect's ggml block codecs and
// GGUF reader, with llama.cpp's own libggml-base (make_fixtures.sh builds and runs it; tests
// never do).
//
// The file holds one F32 tensor "source" [16 rows × 512] of deliberately awkward rows, and for
// each block type T (f16 … q8_K, then tq2_0): tensor "T" of type T (ggml_quantize_chunk(T,
// source) — what llama_model_quantize runs without an importance matrix; q8_K, an activation format
// that ggml_quantize_chunk refuses, comes from quantize_row_q8_K_ref) and tensor "T.dequantized"
// [16 × 512] F32 (ggml's dequantize_row_T of those bytes). Its metadata has one key of every
// GGUF value type, with values the reader test knows.
//
// Build: g++ -std=c++17 make_block_fixture.cpp -L<libdir> -l:libggml-base.so -Wl,-rpath,<libdir>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
struct ggml_context;
struct ggml_tensor;
struct gguf_context;
struct ggml_init_params {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
ggml_context* ggml_init(ggml_init_params params);
void ggml_free(ggml_context* ctx);
ggml_tensor* ggml_new_tensor_2d(ggml_context* ctx, int type, int64_t ne0, int64_t ne1);
ggml_tensor* ggml_set_name(ggml_tensor* tensor, const char* name);
void* ggml_get_data(const ggml_tensor* tensor);
size_t ggml_row_size(int type, int64_t ne);
size_t ggml_quantize_chunk(int type, const float* src, void* dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float* imatrix);
void quantize_row_q8_K_ref(const float* x, void* y, int64_t k);
void ggml_fp16_to_fp32_row(const uint16_t* x, float* y, int64_t n);
void ggml_bf16_to_fp32_row(const uint16_t* x, float* y, int64_t n);
void dequantize_row_q4_0(const void* x, float* y, int64_t k);
void dequantize_row_q4_1(const void* x, float* y, int64_t k);
void dequantize_row_q5_0(const void* x, float* y, int64_t k);
void dequantize_row_q5_1(const void* x, float* y, int64_t k);
void dequantize_row_q8_0(const void* x, float* y, int64_t k);
void dequantize_row_q4_K(const void* x, float* y, int64_t k);
void dequantize_row_q5_K(const void* x, float* y, int64_t k);
void dequantize_row_q6_K(const void* x, float* y, int64_t k);
void dequantize_row_q8_K(const void* x, float* y, int64_t k);
void dequantize_row_tq2_0(const void* x, float* y, int64_t k);
gguf_context* gguf_init_empty(void);
void gguf_free(gguf_context* ctx);
void gguf_set_val_u8(gguf_context*, const char*, uint8_t);
void gguf_set_val_i8(gguf_context*, const char*, int8_t);
void gguf_set_val_u16(gguf_context*, const char*, uint16_t);
void gguf_set_val_i16(gguf_context*, const char*, int16_t);
void gguf_set_val_u32(gguf_context*, const char*, uint32_t);
void gguf_set_val_i32(gguf_context*, const char*, int32_t);
void gguf_set_val_f32(gguf_context*, const char*, float);
void gguf_set_val_u64(gguf_context*, const char*, uint64_t);
void gguf_set_val_i64(gguf_context*, const char*, int64_t);
void gguf_set_val_f64(gguf_context*, const char*, double);
void gguf_set_val_bool(gguf_context*, const char*, bool);
void gguf_set_val_str(gguf_context*, const char*, const char*);
void gguf_set_arr_data(gguf_context*, const char*, int type, const void* data, size_t n);
void gguf_set_arr_str(gguf_context*, const char*, const char** data, size_t n);
void gguf_add_tensor(gguf_context* ctx, const ggml_tensor* tensor);
bool gguf_write_to_file(const gguf_context* ctx, const char* fname, bool only_meta);
}

namespace {

constexpr int rows = 16, cols = 512;

// splitmix64: a fixed stream, so the fixture is the same on every run.
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  float gauss() {
    const double u = uniform() + 1e-300, v = uniform();
    return static_cast<float>(std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v));
  }
};

std::vector<float> make_source() {
  Random random{20261202};
  std::vector<float> x(rows * cols);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    for (int c = 0; c < cols; ++c) {
      const float g = random.gauss();
      switch (r) {
        case 0:
          row[c] = g;
          break;
        case 1:
          row[c] = static_cast<float>(2 * random.uniform() - 1);
          break;
        case 2:
          row[c] = g * g * g;
          break;  // heavy tails: one value dominates its block
        case 3:   // a zero super-block, then constant, one-signed and sparse sub-blocks
          if (c < 256)
            row[c] = 0;
          else if (c < 288)
            row[c] = 0.5f;
          else if (c < 320)
            row[c] = -std::fabs(g);
          else if (c < 352)
            row[c] = (c % 7 == 0) ? g : 0;
          else if (c < 384)
            row[c] = (c % 2) ? 1.0f : -1.0f;
          else
            row[c] = g * 0.01f;
          break;
        case 4:
          row[c] = g * 1e-5f;
          break;  // scales in fp16's subnormal range
        case 5:
          row[c] = g * 300;
          break;
        case 6:
          row[c] = std::fabs(g) + 0.1f;
          break;  // every block's minimum above zero
        case 7:
          row[c] = static_cast<float>(static_cast<int>(random.next() % 33) - 16) * 0.5f;
          break;
        case 8:
          row[c] = g * (c % 32 == 5 ? 40.f : 1.f);
          break;  // an outlier in every block
        case 9:
          row[c] = -std::fabs(g) - 1;
          break;
        default:
          row[c] = g * static_cast<float>(std::exp(2 * random.gauss()));
          break;
      }
    }
  }
  return x;
}

struct BlockType {
  const char* name;
  int id;
  void (*dequantize)(const void*, float*, int64_t);
};

void from_f16(const void* x, float* y, int64_t n) {
  ggml_fp16_to_fp32_row(static_cast<const uint16_t*>(x), y, n);
}
void from_bf16(const void* x, float* y, int64_t n) {
  ggml_bf16_to_fp32_row(static_cast<const uint16_t*>(x), y, n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_block_fixture OUT.gguf\n");
    return 2;
  }
  const BlockType types[] = {
      {"f16", 1, from_f16},
      {"bf16", 30, from_bf16},
      {"q4_0", 2, dequantize_row_q4_0},
      {"q4_1", 3, dequantize_row_q4_1},
      {"q5_0", 6, dequantize_row_q5_0},
      {"q5_1", 7, dequantize_row_q5_1},
      {"q8_0", 8, dequantize_row_q8_0},
      {"q4_K", 12, dequantize_row_q4_K},
      {"q5_K", 13, dequantize_row_q5_K},
      {"q6_K", 14, dequantize_row_q6_K},
      {"q8_K", 15, dequantize_row_q8_K},
      // Added after the others, so their bytes and offsets in the file stay as they were. TQ1_0
      // (34) is not here: dissect does not decode it.
      {"tq2_0", 35, dequantize_row_tq2_0},
  };
  const std::vector<float> source = make_source();

  ggml_context* ctx = ggml_init({64u << 20, nullptr, false});
  gguf_context* gguf = gguf_init_empty();
  gguf_set_val_str(gguf, "general.architecture", "dissect-fixture");
  gguf_set_val_str(gguf, "general.name", "ggml block reference");
  gguf_set_val_u8(gguf, "test.u8", 200);
  gguf_set_val_i8(gguf, "test.i8", -100);
  gguf_set_val_u16(gguf, "test.u16", 60000);
  gguf_set_val_i16(gguf, "test.i16", -30000);
  gguf_set_val_u32(gguf, "test.u32", 4000000000u);
  gguf_set_val_i32(gguf, "test.i32", -2000000000);
  gguf_set_val_f32(gguf, "test.f32", 0.1f);
  gguf_set_val_u64(gguf, "test.u64", 18000000000000000000ull);
  gguf_set_val_i64(gguf, "test.i64", -9000000000000000000ll);
  gguf_set_val_f64(gguf, "test.f64", -2.5e300);
  gguf_set_val_bool(gguf, "test.bool", true);
  gguf_set_val_str(gguf, "test.string", "na\xc3\xafve \xe2\x86\x92 ok");
  const int32_t ints[] = {1, -2, 3};
  gguf_set_arr_data(gguf, "test.array_i32", 5, ints, 3);
  const float floats[] = {0.5f, -1.25f};
  gguf_set_arr_data(gguf, "test.array_f32", 6, floats, 2);
  const char* strings[] = {"a", "", "\xe4\xb8\xad"};
  gguf_set_arr_str(gguf, "test.array_string", strings, 3);
  gguf_set_arr_data(gguf, "test.array_empty", 0, nullptr, 0);

  ggml_tensor* src = ggml_new_tensor_2d(ctx, 0, cols, rows);
  ggml_set_name(src, "source");
  std::memcpy(ggml_get_data(src), source.data(), source.size() * sizeof(float));
  gguf_add_tensor(gguf, src);

  std::vector<float> decoded(source.size());
  for (const BlockType& type : types) {
    ggml_tensor* q = ggml_new_tensor_2d(ctx, type.id, cols, rows);
    ggml_set_name(q, type.name);
    void* bytes = ggml_get_data(q);
    std::memset(bytes, 0,
                ggml_row_size(type.id, cols) * rows);  // q8_K leaves bsums of a zero block
    if (type.id == 15) {
      quantize_row_q8_K_ref(source.data(), bytes, rows * cols);
    } else {
      ggml_quantize_chunk(type.id, source.data(), bytes, 0, rows, cols, nullptr);
    }
    gguf_add_tensor(gguf, q);
    type.dequantize(bytes, decoded.data(), rows * cols);
    ggml_tensor* dq = ggml_new_tensor_2d(ctx, 0, cols, rows);
    ggml_set_name(dq, (std::string(type.name) + ".dequantized").c_str());
    std::memcpy(ggml_get_data(dq), decoded.data(), decoded.size() * sizeof(float));
    gguf_add_tensor(gguf, dq);
  }
  const bool ok = gguf_write_to_file(gguf, argv[1], false);
  gguf_free(gguf);
  ggml_free(ctx);
  if (!ok) {
    std::fprintf(stderr, "make_block_fixture: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
