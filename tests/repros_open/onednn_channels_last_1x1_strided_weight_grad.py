# ATen's CPU weight gradient (oneDNN) of a 1x1 convolution with stride 2 over 3 input channels,
# with channels-last operands: heap corruption ("free(): invalid next size") or wrong values,
# depending on the image size. NCHW operands: right. torch 2.13.0+cpu on this project's AVX2
# machine. Coil's C++ plugin keeps training graphs with such a convolution NCHW
# (coil_cpu_cpp.backend.onednn_weight_grad_broken); eager users of channels_last still hit it.
# usage: python onednn_channels_last_1x1_strided_weight_grad.py [cl|nchw] [image size, 24: wrong, 64: crash]
import sys

import torch

layout = sys.argv[1] if len(sys.argv) > 1 else "cl"
hw = int(sys.argv[2]) if len(sys.argv) > 2 else 24
fmt = torch.channels_last if layout == "cl" else torch.contiguous_format
torch.manual_seed(0)
for _ in range(20):
    g = torch.randn(2, 48, (hw - 1) // 2 + 1, (hw - 1) // 2 + 1).contiguous(memory_format=fmt)
    x = torch.randn(2, 3, hw, hw).contiguous(memory_format=fmt)
    w = torch.randn(48, 3, 1, 1)
    dw = torch.ops.aten.convolution_backward(g, x, w, [0], [2, 2], [0, 0], [1, 1], False, [0, 0], 1,
                                             [False, True, False])[1]
ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), stride=2)
print(torch.__version__, layout, hw, "max |dW - float64 dW| =", (dw.double() - ref).abs().max().item())
