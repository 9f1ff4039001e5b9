/* Runtime helpers for the C kernels Coil generates for the emu chip: half-precision storage
 * conversions, and the ops whose C spelling needs more than an operator (Python-style
 * division and modulo, NaN-propagating min/max, integer powers, erfinv).
 *
 * Values are computed in their own C type; bf16 and fp16 are stored as uint16_t and computed
 * in float (as ATen does), converted on load and store. <tgmath.h> makes exp(), fmod()...
 * pick the float or double function from the argument's type. */
#ifndef EMU_CHIP_H
#define EMU_CHIP_H
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <tgmath.h>

/* min/max of index expressions (the plugin's IndexPrinter spells them min(a, b) and max(a, b)). */
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))

static inline float emu_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t emu_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float emu_from_bf16(uint16_t h) { return emu_bits_f32((uint32_t)h << 16); }
static inline uint16_t emu_to_bf16(float f) {
  uint32_t u = emu_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                /* nearest even */
}
static inline float emu_from_fp16(uint16_t h) {
  uint32_t body = (uint32_t)(h & 0x7fffu) << 13;
  uint32_t out = emu_f32_bits(emu_bits_f32(body) * 0x1p112f);  /* rebias; subnormals exact */
  if (body >= (0x7c00u << 13)) out |= 0x7f800000u;               /* Inf and NaN */
  return emu_bits_f32(out | ((uint32_t)(h & 0x8000u) << 16));
}
static inline uint16_t emu_to_fp16(float f) {
  uint32_t u = emu_f32_bits(f), a = u & 0x7fffffffu, r;
  if (a >= (143u << 23)) r = a > 0x7f800000u ? 0x7e00u : 0x7c00u;            /* NaN, Inf */
  else if (a < (113u << 23)) r = emu_f32_bits(emu_bits_f32(a) + 0.5f) - emu_f32_bits(0.5f);
  else r = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;            /* nearest even */
  return (uint16_t)(r | ((u >> 16) & 0x8000u));
}
/* A float rounded to the nearest half value (a cast to bf16/fp16 that stays a float). */
static inline float emu_round_bf16(float f) { return emu_from_bf16(emu_to_bf16(f)); }
static inline float emu_round_fp16(float f) { return emu_from_fp16(emu_to_fp16(f)); }

static inline double emu_erfinv(double y) {
  /* Giles' approximation, refined by two Newton steps. */
  if (y <= -1 || y >= 1) return y == -1 ? -INFINITY : (y == 1 ? INFINITY : NAN);
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08; x = 3.43273939e-07 + x * w; x = -3.5233877e-06 + x * w;
    x = -4.39150654e-06 + x * w; x = 0.00021858087 + x * w; x = -0.00125372503 + x * w;
    x = -0.00417768164 + x * w; x = 0.246640727 + x * w; x = 1.50140941 + x * w;
  } else {
    w = sqrt(w) - 3.0;
    x = -0.000200214257; x = 0.000100950558 + x * w; x = 0.00134934322 + x * w;
    x = -0.00367342844 + x * w; x = 0.00573950773 + x * w; x = -0.0076224613 + x * w;
    x = 0.00943887047 + x * w; x = 1.00167406 + x * w; x = 2.83297682 + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; i++) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}

/* Per-type helpers, emu_<op>_<suffix> (suffix f32, f64, i8, i16, i32, i64, u8, b8): the ops
 * of Coil's catalogue that are more than a C operator or a <tgmath.h> call, and the extreme
 * values of each type (initial states of max/min reductions). */
#define EMU_FLOAT_OPS(T, S)                                                                     \
  static const T emu_lowest_##S = -INFINITY, emu_highest_##S = INFINITY;                        \
  static inline T emu_floordiv_##S(T a, T b) { return floor(a / b); }                           \
  static inline T emu_truncdiv_##S(T a, T b) { return trunc(a / b); }                           \
  static inline T emu_fmod_##S(T a, T b) { return fmod(a, b); }                                 \
  static inline T emu_remainder_##S(T a, T b) {                                                 \
    T r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }                    \
  static inline T emu_abs_##S(T x) { return fabs(x); }                                          \
  static inline T emu_sign_##S(T x) { return isnan(x) ? x : (T)((0 < x) - (x < 0)); }           \
  static inline T emu_maximum_##S(T a, T b) { return isnan(a) ? a : (isnan(b) ? b : (a > b ? a : b)); } \
  static inline T emu_minimum_##S(T a, T b) { return isnan(a) ? a : (isnan(b) ? b : (a < b ? a : b)); } \
  static inline T emu_clamp_min_##S(T x, T lo) { return x < lo ? lo : x; } /* NaN x stays */      \
  static inline T emu_clamp_max_##S(T x, T hi) { return x > hi ? hi : x; }                      \
  static inline T emu_pow_##S(T a, T b) { return pow(a, b); }                                   \
  static inline T emu_rsqrt_##S(T x) { return 1 / sqrt(x); }                                    \
  static inline T emu_sigmoid_##S(T x) { return 1 / (1 + exp(-x)); }                            \
  static inline T emu_erfinv_##S(T y) { return (T)emu_erfinv(y); }                              \
  static inline T emu_floor_##S(T x) { return floor(x); }                                       \
  static inline T emu_ceil_##S(T x) { return ceil(x); }                                         \
  static inline T emu_trunc_##S(T x) { return trunc(x); }                                       \
  static inline T emu_round_##S(T x) { return rint(x); } /* half to even */                      \
  static inline bool emu_isnan_##S(T x) { return isnan(x); }                                    \
  static inline bool emu_isinf_##S(T x) { return isinf(x); }                                    \
  static inline bool emu_signbit_##S(T x) { return signbit(x); }
EMU_FLOAT_OPS(float, f32)
EMU_FLOAT_OPS(double, f64)

/* Integer types (and bool): division by zero gives 0 rather than a trap; rounding is the
 * identity. */
#define EMU_INT_OPS(T, S, LOWEST, HIGHEST)                                                      \
  static const T emu_lowest_##S = LOWEST, emu_highest_##S = HIGHEST;                            \
  static inline T emu_floordiv_##S(T a, T b) {                                                  \
    if (b == 0) return 0;                                                                       \
    T q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }                     \
  static inline T emu_truncdiv_##S(T a, T b) { return b == 0 ? 0 : a / b; }                     \
  static inline T emu_fmod_##S(T a, T b) { return b == 0 ? 0 : a % b; }                         \
  static inline T emu_remainder_##S(T a, T b) {                                                 \
    if (b == 0) return 0;                                                                       \
    T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }                        \
  static inline T emu_abs_##S(T x) { return x < 0 ? -x : x; }                                   \
  static inline T emu_sign_##S(T x) { return (T)((0 < x) - (x < 0)); }                          \
  static inline T emu_maximum_##S(T a, T b) { return a > b ? a : b; }                           \
  static inline T emu_minimum_##S(T a, T b) { return a < b ? a : b; }                           \
  static inline T emu_clamp_min_##S(T x, T lo) { return x < lo ? lo : x; }                      \
  static inline T emu_clamp_max_##S(T x, T hi) { return x > hi ? hi : x; }                      \
  static inline T emu_pow_##S(T a, T b) {                                                       \
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);                          \
    T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }                     \
  static inline T emu_floor_##S(T x) { return x; }                                              \
  static inline T emu_ceil_##S(T x) { return x; }                                               \
  static inline T emu_trunc_##S(T x) { return x; }                                              \
  static inline T emu_round_##S(T x) { return x; }                                              \
  static inline bool emu_isnan_##S(T x) { (void)x; return false; }                              \
  static inline bool emu_isinf_##S(T x) { (void)x; return false; }                              \
  static inline bool emu_signbit_##S(T x) { return x < 0; }
EMU_INT_OPS(int8_t, i8, INT8_MIN, INT8_MAX)
EMU_INT_OPS(int16_t, i16, INT16_MIN, INT16_MAX)
EMU_INT_OPS(int32_t, i32, INT32_MIN, INT32_MAX)
EMU_INT_OPS(int64_t, i64, INT64_MIN, INT64_MAX)
EMU_INT_OPS(uint8_t, u8, 0, UINT8_MAX)
EMU_INT_OPS(bool, b8, false, true)

#endif
