"""The first call of a compiled graph checks its outputs against what Dynamo traced
(``coil.output_check``): a wrong tensor returned in an output's place raises, never passes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import coil  # noqa: F401 - registers the backend
from coil import output_check
from coil.errors import OutputMismatchError


def _with(returning):
    """A Dynamo backend whose compiled graph returns ``returning(graph outputs)``, checked."""
    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        return output_check.checked(lambda *args: returning(gm(*args)), gm)
    return backend


def _f(x: torch.Tensor, y: torch.Tensor):
    return x + 1, (y * 2).to(torch.float64), x.sum()


@pytest.mark.parametrize("wrong, message", [
    (lambda out: (out[0][:1], *out[1:]),
     "output 0 of a compiled graph is cpu float32[1, 3] where the graph traced cpu float32[4, 3]"),
    (lambda out: (out[0], out[1].float(), out[2]),
     "output 1 of a compiled graph is cpu float32[5] where the graph traced cpu float64[5]"),
    (lambda out: (out[0], out[1], out[0]),
     "output 2 of a compiled graph is cpu float32[4, 3] where the graph traced cpu float32[]"),
])
def test_a_wrong_output_raises_on_the_first_call_and_every_later_one(wrong, message) -> None:
    torch._dynamo.reset()
    x, y = torch.randn(4, 3), torch.randn(5)
    fn = torch.compile(_f, backend=_with(wrong))
    for _ in range(2):
        with pytest.raises(OutputMismatchError, match=message.replace("[", r"\[").replace("]", r"\]")):
            fn(x, y)


def test_right_outputs_pass_and_symbolic_sizes_are_not_compared() -> None:
    torch._dynamo.reset()
    fn = torch.compile(_f, backend=_with(lambda out: out), dynamic=True)
    for n in (4, 6, 9):
        x, y = torch.randn(n, 3), torch.randn(n + 1)
        for got, want in zip(fn(x, y), _f(x, y)):
            torch.testing.assert_close(got, want)


def test_the_spec_of_a_graph_without_example_values_is_unknown() -> None:
    gm = torch.fx.symbolic_trace(lambda x: (x + 1,))
    assert output_check.traced_outputs(gm) is None


class _SpectralAndMaxNorm(nn.Module):
    """tests/repros_open/aot_output_swap_spectral_norm_embedding_max_norm.py: AOTAutograd
    (PyTorch 2.11-2.13, every backend that uses it) returns spectral_norm's ``_u`` buffer
    in place of the last embedding's output under grad."""

    def __init__(self) -> None:
        super().__init__()
        self.sn = parametrizations.spectral_norm(nn.Linear(5, 3))
        self.emb = nn.Embedding(7, 5, max_norm=1.0)
        self.emb2 = nn.Embedding(7, 5)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor([0, 3, 3, 6])
        self.sn(v)
        self.emb(ids)
        return self.emb2(ids)


def test_coil_never_returns_aotautograds_swapped_output_silently() -> None:
    """Right, or OutputMismatchError: with torch's defect present it raises; once torch fixes
    it the output must be eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _SpectralAndMaxNorm(), torch.randn(2, 5)
    want = copy.deepcopy(model)(x)
    compiled = torch.compile(copy.deepcopy(model), backend="coil")
    try:
        got = compiled(x)
    except OutputMismatchError as exc:
        assert "output 0" in str(exc) and "float32[4, 5]" in str(exc)
        with pytest.raises(OutputMismatchError):
            compiled(x)
        return
    torch.testing.assert_close(got, want)
