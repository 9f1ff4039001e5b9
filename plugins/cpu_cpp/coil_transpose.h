// Coil C++ plugin: tiles of a tensor read across its rows, transposed through registers.
//
// A tiled transpose (tiling.py) loops over square tiles of two dims; a tensor read along the
// outer of the two is strided along the loop's vector lanes, which the compiler turns into a
// gather per vector. transpose_tile copies the tile into a local array in the loop's order
// instead: dst[i * ldd + j] = src[i + j * ld] for i < rows, j < cols. Blocks of 4-byte
// elements go through registers: 16x16 with AVX-512, 8x8 with AVX2 (the classic unpack /
// shuffle / lane-permute sequence); the tile's ragged edges and other element sizes go
// element by element. `x + y.t()` of 1536x4096 float32, one thread, a C++ harness: 16x16
// blocks 5.8 ms, 8x8 6.1-6.3, the strided loads 9.0-9.8. No <immintrin.h>: that header alone
// adds 0.2-0.3 s to a library's compile (see coil_cpu.h's stream_line); GCC's builtins for
// the same instructions cost nothing to include.
#pragma once

#include <cstdint>
#include <cstring>

namespace coil {

#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
// AVX-512: 16x16 blocks, the unpack / 64-bit unpack / 128-bit-lane shuffle sequence written
// with GCC's builtins for those instructions (what <immintrin.h>'s intrinsics expand to).
// The vector types must be may_alias, and the loads and stores go through an aligned(1)
// type, as the intrinsics' own types do: the same sequence on plain vector types with
// memcpy'd rows ran at half the speed.
constexpr int64_t TRANSPOSE_BLOCK = 16;
typedef float transpose_f16 __attribute__((vector_size(64), may_alias));
typedef float transpose_f16_u __attribute__((vector_size(64), may_alias, aligned(1)));
typedef double transpose_d8 __attribute__((vector_size(64), may_alias));
#define COIL_UNPACK_LO(a, b) __builtin_ia32_unpcklps512_mask((a), (b), (a), (unsigned short)-1)
#define COIL_UNPACK_HI(a, b) __builtin_ia32_unpckhps512_mask((a), (b), (a), (unsigned short)-1)
#define COIL_UNPACK_LO2(a, b) \
  ((transpose_f16)__builtin_ia32_unpcklpd512_mask((transpose_d8)(a), (transpose_d8)(b), (transpose_d8)(a), (unsigned char)-1))
#define COIL_UNPACK_HI2(a, b) \
  ((transpose_f16)__builtin_ia32_unpckhpd512_mask((transpose_d8)(a), (transpose_d8)(b), (transpose_d8)(a), (unsigned char)-1))
#define COIL_LANES(a, b, imm) __builtin_ia32_shuf_f32x4_mask((a), (b), (imm), (a), (unsigned short)-1)
inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  transpose_f16 r[16], t[16];
  for (int k = 0; k < 16; k++) r[k] = *reinterpret_cast<const transpose_f16_u*>(src + k * ld);
  for (int k = 0; k < 8; k++) {
    t[2 * k] = COIL_UNPACK_LO(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = COIL_UNPACK_HI(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; k++) {
    r[4 * k] = COIL_UNPACK_LO2(t[4 * k], t[4 * k + 2]);
    r[4 * k + 1] = COIL_UNPACK_HI2(t[4 * k], t[4 * k + 2]);
    r[4 * k + 2] = COIL_UNPACK_LO2(t[4 * k + 1], t[4 * k + 3]);
    r[4 * k + 3] = COIL_UNPACK_HI2(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int k = 0; k < 2; k++)
    for (int m = 0; m < 4; m++) {
      t[8 * k + m] = COIL_LANES(r[8 * k + m], r[8 * k + m + 4], 0x88);
      t[8 * k + m + 4] = COIL_LANES(r[8 * k + m], r[8 * k + m + 4], 0xdd);
    }
  for (int m = 0; m < 8; m++) {
    r[m] = COIL_LANES(t[m], t[m + 8], 0x88);
    r[m + 8] = COIL_LANES(t[m], t[m + 8], 0xdd);
  }
  for (int k = 0; k < 16; k++) *reinterpret_cast<transpose_f16_u*>(dst + k * ldd) = r[k];
}
#undef COIL_UNPACK_LO
#undef COIL_UNPACK_HI
#undef COIL_UNPACK_LO2
#undef COIL_UNPACK_HI2
#undef COIL_LANES
#elif defined(__GNUC__) && !defined(__clang__) && defined(__AVX2__)
// AVX2: 8x8 blocks, GCC's generic vector types and two-source shuffles, with constant masks
// that are the unpack / 128-bit-lane shuffles of the same sequence, which GCC emits as those
// instructions (vunpcklps, vshufps, vperm2f128).
constexpr int64_t TRANSPOSE_BLOCK = 8;
typedef float transpose_f8 __attribute__((vector_size(32)));
typedef int transpose_i8 __attribute__((vector_size(32)));
inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  transpose_f8 r[8], t[8], u[8];
  for (int k = 0; k < 8; k++) std::memcpy(&r[k], src + k * ld, 32);
  for (int k = 0; k < 4; k++) {
    t[2 * k] = __builtin_shuffle(r[2 * k], r[2 * k + 1], (transpose_i8){0, 8, 1, 9, 4, 12, 5, 13});
    t[2 * k + 1] = __builtin_shuffle(r[2 * k], r[2 * k + 1], (transpose_i8){2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int k = 0; k < 2; k++)
    for (int m = 0; m < 2; m++) {
      u[4 * k + 2 * m] = __builtin_shuffle(t[4 * k + m], t[4 * k + m + 2], (transpose_i8){0, 1, 8, 9, 4, 5, 12, 13});
      u[4 * k + 2 * m + 1] = __builtin_shuffle(t[4 * k + m], t[4 * k + m + 2], (transpose_i8){2, 3, 10, 11, 6, 7, 14, 15});
    }
  for (int m = 0; m < 4; m++) {
    r[m] = __builtin_shuffle(u[m], u[m + 4], (transpose_i8){0, 1, 2, 3, 8, 9, 10, 11});
    r[m + 4] = __builtin_shuffle(u[m], u[m + 4], (transpose_i8){4, 5, 6, 7, 12, 13, 14, 15});
  }
  for (int k = 0; k < 8; k++) std::memcpy(dst + k * ldd, &r[k], 32);
}
#else
constexpr int64_t TRANSPOSE_BLOCK = 0;
inline void transpose_block(const float*, int64_t, float*, int64_t) {}
#endif

template <typename T>
inline void transpose_tile(const T* src, int64_t ld, T* dst, int64_t ldd, int64_t rows, int64_t cols) {
  int64_t full_rows = 0, full_cols = 0;
  if constexpr (sizeof(T) == 4 && TRANSPOSE_BLOCK > 0) {
    full_rows = rows / TRANSPOSE_BLOCK * TRANSPOSE_BLOCK;
    full_cols = cols / TRANSPOSE_BLOCK * TRANSPOSE_BLOCK;
    for (int64_t jb = 0; jb < full_cols; jb += TRANSPOSE_BLOCK)
      for (int64_t ib = 0; ib < full_rows; ib += TRANSPOSE_BLOCK)
        transpose_block(reinterpret_cast<const float*>(src + ib + jb * ld), ld,
                        reinterpret_cast<float*>(dst + ib * ldd + jb), ldd);
  }
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = j < full_cols ? full_rows : 0; i < rows; i++) dst[i * ldd + j] = src[i + j * ld];
}

}  // namespace coil
