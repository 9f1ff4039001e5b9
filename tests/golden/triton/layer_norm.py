@jit
def k0_var_mean_sub_add_rsqrt_mul(p_arg0, p_arg1, p_arg2, p_buf2, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rbase = tl.arange(0, RBLOCK)[None, :]
    rindex = rbase
    t1 = tl.load(p_arg0 + (xindex * 256 + rindex))
    t2 = tl.load(p_arg0 + (xindex * 256))
    t3 = coil_isinf(t2)
    t4 = tl.where(t3, tl.full([1, 1], 0.0, tl.float32), t2)
    t5 = (t1 - t4)
    buf0_v = tl.broadcast_to((t5).to(tl.float32), [XBLOCK, RBLOCK])
    buf0_mean = tl.sum(buf0_v, 1)[:, None] / (256)
    buf0_d = buf0_v - buf0_mean
    buf0_m2 = tl.sum(buf0_d * buf0_d, 1)[:, None]
    t6 = (buf0_mean).to(tl.float32)
    t7 = (buf0_m2).to(tl.float32)
    t8 = (t6 + t4)
    t9 = (t1 - t8)
    t10 = (256) + tl.zeros([XBLOCK, 1], tl.int64)
    t11 = t10.to(tl.float32)
    t12 = (t11 - tl.full([1, 1], 0.0, tl.float32))
    t13 = max_nan(t12, tl.full([1, 1], 0.0, tl.float32))
    t14 = (t7 / t13)
    t15 = (t14 + tl.full([1, 1], 1e-05, tl.float32))
    t16 = libdevice.rsqrt(t15)
    t17 = (t9 * t16)
    t18 = tl.load(p_arg1 + (rindex))
    t19 = (t17 * t18)
    t20 = tl.load(p_arg2 + (rindex))
    t21 = (t19 + t20)
    t22 = (t21).to(tl.float32)
    tl.store(p_buf2 + (xindex * 256 + rindex), tl.broadcast_to(t22, [XBLOCK, RBLOCK]).to(tl.float32))
