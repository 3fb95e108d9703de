/* The weights of PyTorch's CPU weight-only kernels unpacked to bf16, for a long prompt's
 * rows: those kernels dequantize the weights again for every few rows (int8's took 25 ms
 * a SmolLM2 layer for 512 rows, a bf16 GEMM 4.6), so a prompt's rows take a bf16 GEMM
 * on the weights unpacked once per call instead (linears.Int4, linears.Int8).
 *
 * int4 (_convert_weight_to_int4pack_for_cpu, the layout _weight_int4pack_mm_for_cpu
 * reads), as torch 2.x writes it on x86 with AVX512: outputs in blocks of 64, a block
 * stored input by input, 32 bytes an input: output j of the block in the low nibble of
 * byte j (j < 32) or the high nibble of byte j - 32. Other builds may write another
 * (AVX2 blocks are narrower), so linears.Int4 checks at load that this unpacking gives
 * back the values it packed, and runs PyTorch's kernel for every row where it does not.
 * Scales and zeros: [in / group, out, 2] bf16, w = (q - 8) * scale + zero, in fp32 and
 * rounded once to bf16 (nearest even). Stateless; safe from any thread. */
#include <stdint.h>

#include "bf16.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define UNPACK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define UNPACK_CLONES
#endif

#define BLOCK 64

/* wt [k][n] (bf16, the weight transposed: a GEMM takes it as a transposed view) from the
 * packed weight of n outputs (a multiple of 64) and k inputs (a multiple of group).
 * Threads: the calling thread's OpenMP team, over the input groups. */
UNPACK_CLONES
void llmso_int4pack_weights(const uint8_t* packed, const uint16_t* scales_zeros, int64_t n,
                            int64_t k, int64_t group, uint16_t* wt) {
  const int64_t blocks = n / BLOCK, groups = k / group;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b) {
      float s[BLOCK], z[BLOCK];
      const uint16_t* sz = scales_zeros + (g * n + b * BLOCK) * 2;
      for (int j = 0; j < BLOCK; ++j) {
        s[j] = from_bf16(sz[2 * j]);
        z[j] = from_bf16(sz[2 * j + 1]);
      }
      const uint8_t* block = packed + b * BLOCK * k / 2;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const uint8_t* bytes = block + i * (BLOCK / 2);
        uint16_t* out = wt + i * n + b * BLOCK;
        for (int j = 0; j < BLOCK / 2; ++j) {
          out[j] = to_bf16((float)((bytes[j] & 15) - 8) * s[j] + z[j]);
          out[j + BLOCK / 2] =
              to_bf16((float)((bytes[j] >> 4) - 8) * s[j + BLOCK / 2] + z[j + BLOCK / 2]);
        }
      }
    }
}

/* w[n][k] (bf16) = q[n][k] * scales[n] (int8 weights [n][k], one bf16 scale an output:
 * _weight_int8pack_mm's), each product rounded once. Threads: the calling thread's
 * OpenMP team, over the outputs. */
UNPACK_CLONES
void llmso_int8_weights(const int8_t* q, const uint16_t* scales, int64_t n, int64_t k,
                        uint16_t* w) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < n; ++o) {
    const float s = from_bf16(scales[o]);
    const int8_t* row = q + o * k;
    uint16_t* out = w + o * k;
    for (int64_t i = 0; i < k; ++i) out[i] = to_bf16((float)row[i] * s);
  }
}
