@jit
def k0_sum(p_arg0, p_buf0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rbase = tl.arange(0, RBLOCK)[None, :]
    buf0_acc = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, 64, RBLOCK):
        rindex = roffset + rbase
        t1 = tl.load(p_arg0 + (xindex + rindex * 256))
        buf0_v = tl.broadcast_to((t1).to(tl.float32), [XBLOCK, RBLOCK])
        buf0_acc = add_combine(buf0_acc, buf0_v)
    buf0_r = tl.sum(buf0_acc, 1)[:, None]
    t2 = (buf0_r).to(tl.float32)
    tl.store(p_buf0 + (xindex), tl.broadcast_to(t2, [XBLOCK, 1]).to(tl.float32))
