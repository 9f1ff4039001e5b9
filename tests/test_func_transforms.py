"""``torch.func`` transforms inside a compiled function, against eager. Under ``vmap`` the
graphs Coil receives hold ``aten._to_copy`` of a plain number (``a[j] * 3``, ``a ** 3``
inside ``grad``), which the lowering read as a tensor (AttributeError; a hunt, session 39)."""
from __future__ import annotations

import pytest
import torch
from torch.func import grad, vmap

import coil  # noqa: F401  (registers the backend)

X, I = torch.randn(4, 6), torch.tensor([0, 5, 2, 2])

CASES = {
    "index_scale": lambda x: vmap(lambda a, j: a[j] * 3 + 1)(x, I),
    "two_elements": lambda x: vmap(lambda a: a[2] * 2 - a[0])(x),
    "grad_of_cube": lambda x: vmap(grad(lambda a: (a ** 3).sum() * 0.5))(x),
    "where": lambda x: vmap(lambda a: torch.where(a > 0, a, 0.0))(x),
}


@pytest.mark.parametrize("name", CASES)
def test_vmap_in_a_compiled_function(name):
    fn = CASES[name]
    torch.testing.assert_close(torch.compile(fn, backend="coil")(X), fn(X))
