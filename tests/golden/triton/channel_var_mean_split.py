@jit
def k0_var_mean(p_arg0, p_buf2, p_buf3, p_ws_buf0_mean, p_ws_buf0_m2, p_ws_buf0_n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    part = pid // 5
    xindex = (pid % 5) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < 5
    rbase = tl.arange(0, RBLOCK)[None, :]
    buf0_mean = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    buf0_m2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    buf0_n = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for roffset in range(loop_bound(part * 12288), loop_bound(part * 12288) + 12288, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < 24522
        r0 = (rindex // 4087)
        r1_2 = (rindex % 4087)
        t1 = tl.load(p_arg0 + (xindex * 4087 + r1_2 + r0 * 20435), mask=xmask & rmask, other=0)
        buf0_v = tl.broadcast_to((t1).to(tl.float32), [XBLOCK, RBLOCK])
        buf0_n1 = buf0_n + 1.0
        buf0_delta = buf0_v - buf0_mean
        buf0_mean1 = buf0_mean + buf0_delta / buf0_n1
        buf0_m2 = tl.where(xmask & rmask, buf0_m2 + buf0_delta * (buf0_v - buf0_mean1), buf0_m2)
        buf0_mean = tl.where(xmask & rmask, buf0_mean1, buf0_mean)
        buf0_n = tl.where(xmask & rmask, buf0_n1, buf0_n)
    buf0_cnt = tl.sum(buf0_n, 1)[:, None]
    buf0_cmean = tl.sum(buf0_mean * buf0_n, 1)[:, None] / tl.where(buf0_cnt == 0, 1.0, buf0_cnt)
    buf0_dev = tl.where(buf0_n == 0, 0.0, buf0_mean - buf0_cmean)
    buf0_cm2 = tl.sum(buf0_m2 + buf0_n * buf0_dev * buf0_dev, 1)[:, None]
    tl.store(p_ws_buf0_mean + part * 5 + xindex, (buf0_cmean).to(tl.float32), xmask)
    tl.store(p_ws_buf0_m2 + part * 5 + xindex, (buf0_cm2).to(tl.float32), xmask)
    tl.store(p_ws_buf0_n + part * 5 + xindex, (buf0_cnt).to(tl.float32), xmask)

@jit
def k0_var_mean_combine(p_arg0, p_buf2, p_buf3, p_ws_buf0_mean, p_ws_buf0_m2, p_ws_buf0_n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < 5
    sindex = tl.arange(0, RBLOCK)[None, :]
    smask = sindex < 2
    w_mean = tl.load(p_ws_buf0_mean + sindex * 5 + xindex, mask=xmask & smask, other=0)
    w_m2 = tl.load(p_ws_buf0_m2 + sindex * 5 + xindex, mask=xmask & smask, other=0)
    w_n = tl.load(p_ws_buf0_n + sindex * 5 + xindex, mask=xmask & smask, other=0)
    r0_cnt = tl.sum(w_n, 1)[:, None]
    r0_cmean = tl.sum(w_mean * w_n, 1)[:, None] / tl.where(r0_cnt == 0, 1.0, r0_cnt)
    r0_dev = tl.where(w_n == 0, 0.0, w_mean - r0_cmean)
    r0_cm2 = tl.sum(w_m2 + w_n * r0_dev * r0_dev, 1)[:, None]
    t2 = (r0_cmean).to(tl.float32)
    t3 = (r0_cm2).to(tl.float32)
    t4 = (24522) + tl.zeros([XBLOCK, 1], tl.int64)
    t5 = t4.to(tl.float32)
    t6 = (t5 - tl.full([1, 1], 0.0, tl.float32))
    t7 = max_nan(t6, tl.full([1, 1], 0.0, tl.float32))
    t8 = tl.div_rn(t3, t7)
    t9 = (t8).to(tl.float32)
    tl.store(p_buf2 + (xindex), tl.broadcast_to(t9, [XBLOCK, 1]).to(tl.float32), xmask)
    t10 = (t2).to(tl.float32)
    tl.store(p_buf3 + (xindex), tl.broadcast_to(t10, [XBLOCK, 1]).to(tl.float32), xmask)
