"""``bench/train_side_by_side.py``: its inference mode (``--mode infer``) runs the model in
``eval()`` under ``no_grad`` through each backend and checks the outputs against eager's; the
default stays a training step. One round of one call, so this checks behaviour, not speed."""
from __future__ import annotations

from types import ModuleType

import pytest

from helpers import load_bench
from models import check, imports


@pytest.fixture(scope="module")
def script() -> ModuleType:
    imports.import_optional("transformers")
    pytest.importorskip("transformers")
    return load_bench("train_side_by_side")


@pytest.mark.parametrize("mode, unit", [("infer", "call"), ("train", "step")])
def test_modes_check_against_eager_and_time(script, capsys, mode, unit):
    script.main(["hf_distilbert", "--device", "cpu", "--size", "small", "--precision", "fp32",
                 "--backends", "eager,coil", "--rounds", "1", "--steps", "1", "--mode", mode])
    out = capsys.readouterr().out
    counted = "1 of 1" if mode == "infer" else "41 of 41"  # the logits; or the loss and 40 gradients
    assert f"coil: {counted} tensors within tolerance" in out and "first outside" not in out, out
    assert f"ms per {unit} (median)" in out
    assert "| hf_distilbert | coil |" in out


def test_inference_call_is_eval_and_no_grad(script):
    import torch
    from models import zoo  # after the fixture's optional imports
    built = zoo.build("hf_distilbert", "small")
    built.model.train()
    call, first = script.make_infer(built, "eager", torch.device("cpu"), bf16=False)
    call()
    (name, out), = first[0]
    assert not out.requires_grad
    with torch.no_grad():
        expected = built.model.eval()(*built.args, **built.kwargs)
    torch.testing.assert_close(out, next(t for _, t in check.flatten_output(expected)))
