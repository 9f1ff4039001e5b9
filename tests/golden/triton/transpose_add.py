@jit
def k0_add(p_arg0, p_arg1, p_buf0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    columns = tl.cdiv(80, RBLOCK)
    xindex = (pid // columns) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = (pid % columns) * RBLOCK + tl.arange(0, RBLOCK)[None, :]
    xmask = xindex < 96
    rmask = rindex < 80
    t1 = tl.load(p_arg0 + (xindex * 80 + rindex), mask=xmask & rmask, other=0)
    t2 = tl.load(p_arg1 + (xindex + rindex * 96), mask=xmask & rmask, other=0)
    t3 = (t1 + t2)
    t4 = (t3).to(tl.float32)
    tl.store(p_buf0 + (xindex * 80 + rindex), tl.broadcast_to(t4, [XBLOCK, RBLOCK]).to(tl.float32), xmask & rmask)
