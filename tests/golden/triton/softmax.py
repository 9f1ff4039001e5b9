@jit
def k0_amax_sub_exp_sum_reciprocal_mul(p_arg0, p_buf2, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rbase = tl.arange(0, RBLOCK)[None, :]
    rindex = rbase
    t1 = tl.load(p_arg0 + (xindex * 256 + rindex))
    buf0_v = tl.broadcast_to((t1).to(tl.float32), [XBLOCK, RBLOCK])
    buf0_r = tl.reduce(buf0_v, 1, max_nan)[:, None]
    t2 = (buf0_r).to(tl.float32)
    t3 = (t1 - t2)
    t4 = libdevice.exp(t3)
    buf1_v = tl.broadcast_to((t4).to(tl.float32), [XBLOCK, RBLOCK])
    buf1_r = tl.sum(buf1_v, 1)[:, None]
    t5 = (buf1_r).to(tl.float32)
    t6 = tl.div_rn(1.0, t5)
    t7 = (t4 * t6)
    t8 = (t7).to(tl.float32)
    tl.store(p_buf2 + (xindex * 256 + rindex), tl.broadcast_to(t8, [XBLOCK, RBLOCK]).to(tl.float32))
