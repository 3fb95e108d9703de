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

#endif
