"""ONNX backend node test cases through `GradflowBackend` (a curated subset; all cases:
benchmarks/onnx_conformance.py). Expected outputs come from ONNX's reference implementation; each case is
compared with its own tolerances."""

from __future__ import annotations

import numpy as np
import pytest

from gradflow.frontend.onnx.backend import GradflowBackend
from gradflow.frontend.onnx.conformance import OPS_IN_SCOPE, all_node_cases, case_op, run_case

#: Two to four cases per op in scope, spread over each op's cases (sorted by name).
CURATED = [
    "test_abs", "test_add", "test_add_uint16", "test_averagepool_1d_default", "test_averagepool_2d_pads",
    "test_averagepool_2d_precomputed_strides",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False", "test_batchnorm_epsilon",
    "test_batchnorm_example", "test_cast_DOUBLE_to_FLOAT", "test_cast_FLOAT16_to_FLOAT", "test_clip",
    "test_clip_default_min", "test_concat_1d_axis_0", "test_concat_3d_axis_0", "test_constant",
    "test_basic_conv_with_padding", "test_basic_conv_without_padding", "test_conv_with_autopad_same",
    "test_conv_with_strides_and_asymmetric_padding", "test_convtranspose", "test_convtranspose_3d",
    "test_convtranspose_dilations", "test_convtranspose_group_2_image_3", "test_cos", "test_cos_example",
    "test_cumsum_1d", "test_cumsum_1d_reverse_exclusive", "test_div", "test_div_int8", "test_dropout_default",
    "test_dropout_default_ratio", "test_training_dropout_mask", "test_einsum_batch_diagonal", "test_einsum_scalar",
    "test_erf", "test_exp",
    "test_exp_example", "test_expand_dim_changed", "test_expand_dim_unchanged", "test_flatten_axis0",
    "test_flatten_default_axis", "test_gather_0", "test_gather_2d_indices", "test_gather_elements_0",
    "test_gather_elements_1", "test_gathernd_example_float32", "test_gathernd_example_int32",
    "test_gelu_default_1", "test_gelu_tanh_1", "test_gemm_all_attributes", "test_gemm_beta",
    "test_gemm_default_no_bias", "test_gemm_default_single_elem_vector_bias", "test_globalaveragepool",
    "test_globalaveragepool_precomputed", "test_identity", "test_layer_normalization_2d_axis0",
    "test_layer_normalization_3d_axis0_epsilon", "test_layer_normalization_3d_axis_negative_2_epsilon",
    "test_layer_normalization_4d_axis2", "test_leakyrelu", "test_leakyrelu_default", "test_log",
    "test_log_example", "test_logsoftmax_axis_0", "test_logsoftmax_default_axis", "test_matmul_1d_1d",
    "test_matmul_3d", "test_max_example", "test_max_int8", "test_maxpool_1d_default",
    "test_maxpool_2d_dilations", "test_maxpool_2d_precomputed_strides", "test_maxpool_2d_uint8",
    "test_min_example", "test_min_int8", "test_mul", "test_mul_int8", "test_neg", "test_neg_example",
    "test_constant_pad", "test_edge_pad", "test_pow", "test_pow_types_float32_uint32", "test_reciprocal",
    "test_reciprocal_example", "test_reduce_l2_default_axes_keepdims_example", "test_reduce_l2_empty_set",
    "test_reduce_log_sum_exp_default_axes_keepdims_example", "test_reduce_log_sum_exp_empty_set",
    "test_reduce_max_bool_inputs", "test_reduce_max_empty_set",
    "test_reduce_mean_default_axes_keepdims_example", "test_reduce_mean_keepdims_example",
    "test_reduce_min_bool_inputs", "test_reduce_min_empty_set", "test_reduce_sum_default_axes_keepdims_example",
    "test_reduce_sum_empty_axes_input_noop_example", "test_relu", "test_reshape_extended_dims",
    "test_reshape_reduced_dims", "test_resize_downsample_scales_cubic", "test_resize_downsample_sizes_cubic",
    "test_resize_tf_crop_and_resize_axes_3_2", "test_resize_upsample_scales_nearest",
    "test_scatter_elements_with_axis", "test_scatter_elements_with_reduction_max", "test_scatternd",
    "test_scatternd_max_with_element_indices", "test_shape", "test_shape_example", "test_sigmoid",
    "test_sigmoid_example", "test_sin", "test_sin_example", "test_slice", "test_slice_end_out_of_bounds",
    "test_softmax_axis_0", "test_softmax_default_axis", "test_sce_NCd1_mean_weight_negative_ii",
    "test_sce_NCd1d2d3d4d5_none_no_weight", "test_sce_mean_no_weight_ii_3d_log_prob",
    "test_sce_mean_weight_ii_4d", "test_softplus", "test_softplus_example",
    "test_split_1d_uneven_split_opset18", "test_split_equal_parts_default_axis_opset18", "test_sqrt",
    "test_sqrt_example", "test_squeeze", "test_squeeze_negative_axes", "test_sub", "test_sub_int8",
    "test_sum_example", "test_sum_one_input", "test_tanh", "test_tanh_example", "test_tile",
    "test_tile_precomputed", "test_top_k", "test_top_k_same_values_2d", "test_transpose_all_permutations_0",
    "test_transpose_all_permutations_3", "test_tril", "test_triu", "test_unsqueeze_axis_0",
    "test_unsqueeze_negative_axes", "test_where_example", "test_where_long_example",
]


@pytest.mark.parametrize("name", CURATED)
def test_node_case(name):
    case = all_node_cases()[name]
    assert case_op(case) in OPS_IN_SCOPE
    outcome = run_case(case)
    assert outcome.passed, outcome.reason


def test_curated_subset_covers_every_op_in_scope():
    ops = {case_op(all_node_cases()[n]) for n in CURATED}
    assert ops == set(OPS_IN_SCOPE)


def test_backend_run_node_and_device():
    from onnx import helper

    assert GradflowBackend.supports_device("CPU") and not GradflowBackend.supports_device("CUDA")
    node = helper.make_node("Mul", ["a", "b"], ["c"])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    (c,) = GradflowBackend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a * b)


def test_failures_are_classified_by_reason():
    cases = all_node_cases()
    fp8 = run_case(cases["test_cast_FLOAT_to_FLOAT8E4M3FN"])
    assert not fp8.passed and fp8.category == "element-type" and "FLOAT8E4M3FN" in fp8.reason
    seq = run_case(cases["test_identity_sequence"])
    assert not seq.passed and seq.category == "non-tensor" and "sequence" in seq.reason
