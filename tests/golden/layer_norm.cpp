extern "C" void k0_var_mean_sub_add_rsqrt_mul(int64_t arg0_addr, int64_t arg1_addr, int64_t arg2_addr, int64_t buf2_addr) {
  auto arg0 = reinterpret_cast<const float*>(arg0_addr);
  auto arg1 = reinterpret_cast<const float*>(arg1_addr);
  auto arg2 = reinterpret_cast<const float*>(arg2_addr);
  auto buf2 = reinterpret_cast<float*>(buf2_addr);
  #pragma omp parallel for collapse(1) if(parallel: 32768 > 16384)
  for (int64_t x0 = 0; x0 < 64; x0++) {
    float acc_buf0_mean = float(0);
    float acc_buf0_m2 = float(0);
    float acc_buf0_n = float(0);
    float count_buf0 = 0;
    float lane_buf0_mean[64];
    float lane_buf0_m2[64];
    float lane_buf0_n[64];
    #pragma omp simd
    for (int64_t lane = 0; lane < 64; lane++) {
      lane_buf0_mean[lane] = float(0);
      lane_buf0_m2[lane] = float(0);
      lane_buf0_n[lane] = float(0);
    }
    for (int64_t r0_chunk = 0; r0_chunk < 256; r0_chunk += 64) {
      if (x0 + 1 < 64) {
        for (int64_t ahead = 0; ahead < 64; ahead += 16) {
          int64_t r0 = r0_chunk + ahead;
          __builtin_prefetch(&arg0[(256 + r0 + 256*x0)]);
        }
      }
      count_buf0 += float(1);
      const float weight_buf0 = float(1) / count_buf0;
      #pragma omp simd
      for (int64_t lane = 0; lane < 64; lane++) {
        int64_t r0 = r0_chunk + lane;
        float t1 = arg0[(r0 + 256*x0)];
        coil::welford_update_n<float>(lane_buf0_mean[lane], lane_buf0_m2[lane], lane_buf0_n[lane], t1, count_buf0, weight_buf0);
      }
    }
    #pragma GCC unroll 8
    for (int64_t half = 32; half > 0; half /= 2) {
      #pragma omp simd
      for (int64_t lane = 0; lane < half; lane++) {
        coil::welford_combine<float>(lane_buf0_mean[lane], lane_buf0_m2[lane], lane_buf0_n[lane], lane_buf0_mean[lane + half], lane_buf0_m2[lane + half], lane_buf0_n[lane + half]);
      }
    }
    coil::welford_combine<float>(acc_buf0_mean, acc_buf0_m2, acc_buf0_n, lane_buf0_mean[0], lane_buf0_m2[0], lane_buf0_n[0]);
    float v_buf0 = coil::cast<float>(acc_buf0_mean);
    float v_buf1 = coil::cast<float>(acc_buf0_m2);
    int64_t t2 = static_cast<int64_t>(256);
    float t3 = coil::cast<float>(t2);
    float t4 = (t3 - coil::cast<float>(0.0));
    float t5 = coil::max_nan<float>(t4, coil::cast<float>(0.0));
    float t6 = (v_buf1 / t5);
    float t7 = (t6 + coil::cast<float>(1e-05));
    float t8 = (float(1) / std::sqrt(t7));
    #pragma omp simd
    for (int64_t r0 = 0; r0 < 256; r0++) {
      float t9 = arg0[(r0 + 256*x0)];
      float t10 = (t9 - v_buf0);
      float t11 = (t10 * t8);
      float t12 = arg1[r0];
      float t13 = (t11 * t12);
      float t14 = arg2[r0];
      float t15 = (t13 + t14);
      buf2[(r0 + 256*x0)] = coil::cast<float>(t15);
    }
  }
}
