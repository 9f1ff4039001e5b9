extern "C" void k0_mul_add_sigmoid_abs_sub(int64_t arg0_addr, int64_t buf0_addr) {
  auto arg0 = reinterpret_cast<const float*>(arg0_addr);
  auto buf0 = reinterpret_cast<float*>(buf0_addr);
  #pragma omp simd
  for (int64_t x0 = 0; x0 < 1024; x0++) {
    float t1 = arg0[x0];
    float t2 = (t1 * coil::cast<float>(2.0));
    float t3 = (t2 + coil::cast<float>(1.0));
    float t4 = coil::sigmoid<float>(t3);
    float t5 = coil::abs_<float>(t1);
    float t6 = (t4 - t5);
    buf0[x0] = coil::cast<float>(t6);
  }
}
