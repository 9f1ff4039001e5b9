"""The reference kernel executor (``coil.sdk.reference``) against eager: most of the end-to-end
tests of ``test_compile``, the OpInfo CI sample, the random-program property test and a
training test run again here, with
:class:`~coil.sdk.reference.ReferenceBackend` serving ``"cpu"`` instead of the C++ plugin."""
from __future__ import annotations

import pytest
import torch

import coil
from coil import plugins
from coil.ops import POINTWISE_OPS
from coil.sdk.reference import OPS, REDUCTIONS, ReferenceBackend, apply_op

# Collected again in this module, so they run under the autouse fixture below.
from test_compile import (  # noqa: F401
    test_argmax_argmin_and_max_dim, test_as_strided_of_a_view_input_counts_from_the_storage,
    test_batchnorm_running_stats_match_eager, test_bias_gelu_residual_dtypes,
    test_complex_dtype_falls_back, test_cross_entropy, test_debug_dir_dumps_sources,
    test_dynamic_shapes_compile_once, test_embedding_backward, test_factories,
    test_flip_repeat_slice_scatter, test_full_reduction_is_parallel_and_correct,
    test_gpt_block_has_no_fallback_and_one_kernel_per_norm_and_softmax, test_indexing_and_embedding,
    test_input_mutation_written_back, test_integer_and_bool_dtypes, test_mark_dynamic,
    test_matmul_is_library_call_with_fused_epilogue, test_memory_planner_reuses_buffers,
    test_pointwise_chain_is_one_kernel, test_reductions, test_reshape_of_lazy_value,
    test_scans_cat_pad_where, test_scatter_and_index_put,
    test_softmax_layernorm_rmsnorm_are_single_kernels, test_training_gradients_match_eager,
    test_unknown_op_falls_back, test_views_without_copies)
from test_opinfo import counting_backend, test_compiled_matches_eager  # noqa: F401
from test_properties import test_random_programs_match_eager  # noqa: F401
from test_training import test_gpt_block_gradients  # noqa: F401


@pytest.fixture(autouse=True)
def reference_backend():
    plugins.reset()
    backend = ReferenceBackend()
    coil.register_backend_for_device("cpu", backend)
    yield backend
    plugins.reset()


def test_the_reference_backend_is_the_one_running():
    r = coil.explain(lambda x: torch.softmax(x, -1), torch.randn(3, 5))
    assert r.kernels and all(k.source.startswith("kernel k") for k in r.kernels)
    assert "max(arg0[" in r.kernels[0].source


def test_every_catalogue_op_and_reduction_has_a_spelling():
    assert set(OPS) == set(POINTWISE_OPS)
    assert set(REDUCTIONS) == set(coil.sdk.REDUCTION_TYPES)


def test_integer_ops_follow_the_catalogue():
    a, b = torch.tensor([7, -7, 5, 2]), torch.tensor([2, 2, 0, -1])
    assert apply_op("floordiv", [a, b], torch.int64).tolist() == [3, -4, 0, -2]
    assert apply_op("truncdiv", [a, b], torch.int64).tolist() == [3, -3, 0, -2]
    assert apply_op("remainder", [a, b], torch.int64).tolist() == [1, 1, 0, 0]
    assert apply_op("fmod", [a, b], torch.int64).tolist() == [1, -1, 0, 0]
    base, exp = torch.tensor([2, 1, -1, -1, 3]), torch.tensor([3, -2, -3, -2, -1])
    assert apply_op("pow", [base, exp], torch.int64).tolist() == [8, 1, -1, 1, 0]
    assert apply_op("round", [a, a], torch.int64).tolist() == a.tolist()


def test_nan_semantics():
    nan, one = torch.tensor([float("nan")]), torch.tensor([1.0])
    assert apply_op("clamp_min", [nan, one], torch.float32).isnan().all()
    assert apply_op("maximum", [one, nan], torch.float32).isnan().all()
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")]])
    assert REDUCTIONS["argmax"](x, torch.float32)[0].item() == 1
    assert REDUCTIONS["max"](x, torch.float32)[0].isnan().all()
    empty = torch.zeros(2, 0)
    assert REDUCTIONS["argmin"](empty, torch.float32)[0].tolist() == [-1, -1]
    assert REDUCTIONS["max"](empty, torch.float32)[0].tolist() == [float("-inf")] * 2


def test_masked_loads_read_nothing_out_of_range():
    x = torch.randn(3, 4)
    torch.testing.assert_close(
        torch.compile(lambda x: torch.nn.functional.pad(x, (5, 5, 2, 2), value=-1.0), backend="coil")(x),
        torch.nn.functional.pad(x, (5, 5, 2, 2), value=-1.0))
