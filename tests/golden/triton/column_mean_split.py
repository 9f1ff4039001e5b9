@jit
def k0_mean(p_arg0, p_buf1, p_ws_buf0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    part = pid // 1
    xindex = (pid % 1) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < 48
    rbase = tl.arange(0, RBLOCK)[None, :]
    buf0_acc = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(loop_bound(part * 256), loop_bound(part * 256) + 256, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < 4096
        t1 = tl.load(p_arg0 + (xindex + rindex * 48), mask=xmask & rmask, other=0)
        buf0_v = tl.where(xmask & rmask, tl.broadcast_to((t1).to(tl.float32), [XBLOCK, RBLOCK]), tl.full([1, 1], 0.0, tl.float32))
        buf0_acc = add_combine(buf0_acc, buf0_v)
    buf0_r = tl.sum(buf0_acc, 1)[:, None]
    tl.store(p_ws_buf0 + part * 48 + xindex, (buf0_r).to(tl.float32), xmask)

@jit
def k0_mean_combine(p_arg0, p_buf1, p_ws_buf0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < 48
    sindex = tl.arange(0, RBLOCK)[None, :]
    smask = sindex < 16
    v = tl.load(p_ws_buf0 + sindex * 48 + xindex, mask=xmask & smask, other=0)
    v = tl.where(smask, v, tl.full([1, 1], 0.0, tl.float32))
    r0 = tl.sum(v, 1)[:, None]
    t2 = (r0).to(tl.float32)
    t3 = (4096) + tl.zeros([XBLOCK, 1], tl.int64)
    t4 = t3.to(tl.float32)
    t5 = tl.div_rn(t2, t4)
    t6 = (t5).to(tl.float32)
    tl.store(p_buf1 + (xindex), tl.broadcast_to(t6, [XBLOCK, 1]).to(tl.float32), xmask)
