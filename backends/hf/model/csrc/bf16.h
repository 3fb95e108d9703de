/* bf16 <-> fp32 for the C kernels (glue.c, int_dot.c): bf16 values travel as uint16_t;
 * rounding to bf16 is round-to-nearest-even, NaN to 0x7FC0, as PyTorch rounds. */
#ifndef LLMSO_BF16_H
#define LLMSO_BF16_H

#include <stdint.h>
#include <string.h>

static inline float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (f != f) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* 16 floats rounded as to_bf16 rounds, each in the low half of its 32-bit lane */
__attribute__((target("avx512f"))) static inline __m512i round_bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i h = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  return _mm512_mask_mov_epi32(h, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7FC0));
}
#endif

#endif
