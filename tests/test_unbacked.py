"""Symbols a graph defines while it runs (unbacked sizes): ``item()`` under
``capture_scalar_outputs``, the size of ``nonzero``'s result under
``capture_dynamic_output_shape_ops``, and ``torch._check`` on them. The wrapper left ``u0``
unbound (a NameError) where nothing read the defining call's buffer, and dropped the checks
(a failing ``torch._check`` passed silently; a hunt against eager, session 32)."""
from __future__ import annotations

import pytest
import torch

import coil  # noqa: F401 - registers the backend


@pytest.fixture(autouse=True)
def _capture_unbacked():
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()


X, N = torch.arange(4.0), torch.tensor(2)


@pytest.mark.parametrize("f, args", [
    (lambda x, n: x * n.item(), (X, N)),
    (lambda x, n: x[:n.item()] + 1, (X, N)),
    (lambda x, n: torch.arange(n.item()) * 2, (X, N)),
    (lambda x, n: x.new_zeros(n.item()), (X, N)),
    (lambda x, n: (x + 1, n.item()), (X, N)),
    (lambda x: torch.arange(x.nonzero().shape[0]) * 2, (torch.tensor([1.0, -2.0, 3.0, 0.0]),)),
], ids=["mul", "slice", "arange", "new_zeros", "returned", "nonzero_size"])
def test_a_symbol_the_graph_defines_is_bound(f, args):
    # values only where eager's device is the default one: Dynamo on torch 2.11 builds
    # ``arange`` on the CPU under a CUDA default device (aot_eager and Inductor too; the H100)
    got, expected = torch.compile(f, backend="coil")(*args), f(*args)
    torch.testing.assert_close(got, expected, check_device=False)


def test_a_failing_check_on_an_unbacked_size_raises_as_in_eager():
    def f(x):
        n = x.nonzero().shape[0]
        torch._check(n <= 2)
        return x * 2

    compiled = torch.compile(f, backend="coil")
    torch.testing.assert_close(compiled(torch.tensor([1.0, 0.0, 3.0])), torch.tensor([2.0, 0.0, 6.0]))
    with pytest.raises(RuntimeError):
        f(torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(RuntimeError, match="u0 <= 2|Expected cond"):
        compiled(torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("f", [
    lambda x: x + (x > 0).nonzero().shape[0],
    lambda x: x + (x > 0).sum().item(),
    lambda x: x[x > 0].sum() + (x > 0).nonzero().shape[0],
], ids=["nonzero_size", "item", "masked_sum"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_kernel_using_a_symbol_runs_after_the_call_defining_it(f, dynamic):
    """The symbol's use is a dependency: ``x + (x > 0).nonzero().shape[0]`` fused the ``add``
    with the ``gt`` that ``nonzero`` reads, and the kernel ran before ``u0`` was bound
    (UnboundLocalError; a hunt, session 39)."""
    compiled = torch.compile(f, backend="coil", dynamic=dynamic)
    for n in (50, 37):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
