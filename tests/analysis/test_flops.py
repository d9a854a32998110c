"""FLOP and byte formulas against hand computations, on Op objects built as the profiler
records them (Input Dims / Input type / Concrete Inputs)."""

from __future__ import annotations

import pytest

from gpuprof_nb.analysis.flops import has_formula, op_cost
from gpuprof_nb.model.trace import Op

F32, BF16, F16, I64 = "float", "c10::BFloat16", "c10::Half", "long int"


def make_op(name, dims, types, concrete=None, **kw) -> Op:
    return Op(
        name=name,
        kind="op",
        start_us=0.0,
        dur_us=1.0,
        pid=1,
        tid=1,
        input_dims=tuple(dims),
        input_types=tuple(types),
        concrete_inputs=None if concrete is None else tuple(concrete),
        **kw,
    )


def test_mm_square_fp32_intensity_is_n_over_6():
    n = 512
    c = op_cost(make_op("aten::mm", [[n, n], [n, n]], [F32, F32]))
    assert c is not None
    assert c.flops == 2 * n**3
    assert c.bytes_moved == 3 * n * n * 4
    assert c.flops / c.bytes_moved == pytest.approx(n / 6)
    assert (c.category, c.dtype) == ("gemm", "fp32")


def test_mm_rectangular_bf16():
    c = op_cost(make_op("aten::mm", [[64, 32], [32, 48]], [BF16, BF16]))
    assert c.flops == 2 * 64 * 32 * 48
    assert c.bytes_moved == (64 * 32 + 32 * 48 + 64 * 48) * 2
    assert c.dtype == "bf16"


def test_addmm_counts_bias_bytes_not_flops():
    # The ViT trace's addmm: bias [768], input [788, 768], weight^T [768, 768].
    c = op_cost(
        make_op(
            "aten::addmm",
            [[768], [788, 768], [768, 768], [], []],
            [BF16, BF16, BF16, "Scalar", "Scalar"],
            ["", "", "", "1", "1"],
        )
    )
    assert c.flops == 2 * 788 * 768 * 768
    assert c.bytes_moved == (768 + 788 * 768 + 768 * 768 + 788 * 768) * 2


def test_bmm_and_baddbmm():
    c = op_cost(make_op("aten::bmm", [[3, 5, 7], [3, 7, 2]], [F32, F32]))
    assert c.flops == 2 * 3 * 5 * 7 * 2
    assert c.bytes_moved == 3 * (5 * 7 + 7 * 2 + 5 * 2) * 4
    c2 = op_cost(
        make_op(
            "aten::baddbmm",
            [[3, 5, 2], [3, 5, 7], [3, 7, 2], [], []],
            [F32, F32, F32, "Scalar", "Scalar"],
        )
    )
    assert c2.flops == c.flops
    assert c2.bytes_moved == c.bytes_moved + 3 * 5 * 2 * 4


def test_matmul_broadcasts_batch_and_handles_vectors():
    c = op_cost(make_op("aten::matmul", [[2, 1, 5, 7], [3, 7, 4]], [F32, F32]))
    assert c.flops == 2 * (2 * 3) * 5 * 7 * 4
    assert c.bytes_moved == (2 * 5 * 7 + 3 * 7 * 4 + 6 * 5 * 4) * 4
    dot = op_cost(make_op("aten::matmul", [[9], [9]], [F32, F32]))
    assert dot.flops == 2 * 9
    assert dot.bytes_moved == (9 + 9 + 1) * 4
    assert op_cost(make_op("aten::matmul", [[2, 5, 7], [3, 7, 4]], [F32, F32])) is None


def test_linear_with_and_without_bias():
    c = op_cost(make_op("aten::linear", [[4, 197, 768], [3072, 768], [3072]], [BF16] * 3))
    rows = 4 * 197
    assert c.flops == 2 * rows * 768 * 3072
    assert c.bytes_moved == (rows * 768 + 3072 * 768 + rows * 3072 + 3072) * 2
    nb = op_cost(make_op("aten::linear", [[10, 8], [6, 8], []], [F32, F32, ""]))
    assert nb.flops == 2 * 10 * 8 * 6
    assert nb.bytes_moved == (80 + 48 + 60) * 4


def test_conv2d_from_concrete_stride_padding():
    # ViT patch embedding: 16x16 kernel, stride 16, no padding -> 14x14 output.
    c = op_cost(
        make_op(
            "aten::conv2d",
            [[4, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], []],
            [BF16, BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "1"],
        )
    )
    out = 4 * 768 * 14 * 14
    assert c.flops == 2 * out * 3 * 16 * 16
    assert c.bytes_moved == (4 * 3 * 224 * 224 + 768 * 3 * 16 * 16 + out + 768) * 2
    assert c.category == "conv"


def test_conv_padding_dilation_groups_and_same():
    # 1d: L=20, k=4, dilation 2, padding 2 -> (20 + 4 - 6 - 1)//1 + 1 = 18
    c = op_cost(
        make_op(
            "aten::conv1d",
            [[2, 4, 20], [6, 2, 4], [], [], [], [], []],
            [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "", "[1]", "[2]", "[2]", "2"],
        )
    )
    assert c.flops == 2 * (2 * 6 * 18) * (2 * 4)
    same = op_cost(
        make_op(
            "aten::conv2d",
            [[1, 3, 9, 9], [5, 3, 3, 3], [], [], [], [], []],
            [F32, F32, "", "ScalarList", "str", "ScalarList", "Scalar"],
            ["", "", "", "[1, 1]", "'same'", "[1, 1]", "1"],
        )
    )
    assert same.flops == 2 * (5 * 9 * 9) * 27


def test_convolution_transposed_and_cudnn_argument_order():
    # conv_transpose: in 8x8, k3, stride 2, pad 1, output_padding 1 -> 16x16
    t = op_cost(
        make_op(
            "aten::convolution",
            [[2, 3, 8, 8], [3, 4, 3, 3], [], [], [], [], [], [], []],
            [
                F32,
                F32,
                "",
                "ScalarList",
                "ScalarList",
                "ScalarList",
                "Scalar",
                "ScalarList",
                "Scalar",
            ],
            ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1"],
        )
    )
    assert t.flops == 2 * (2 * 3 * 8 * 8) * (4 * 3 * 3)
    assert t.bytes_moved == (2 * 3 * 64 + 3 * 4 * 9 + 2 * 4 * 16 * 16) * 4
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, ...)
    c = op_cost(
        make_op(
            "aten::cudnn_convolution",
            [[4, 3, 224, 224], [768, 3, 16, 16], [], [], [], []],
            [BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "[0, 0]", "[16, 16]", "[1, 1]", "1"],
        )
    )
    assert c.flops == 2 * (4 * 768 * 14 * 14) * 3 * 16 * 16


def test_convolution_backward_respects_output_mask():
    dims = [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3], [], [], [], [], [], [], [], []]
    types = [F32, F32, F32] + ["ScalarList"] * 8
    conc = ["", "", "", "[8]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    fwd = 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)
    both = op_cost(
        make_op("aten::convolution_backward", dims, types, conc + ["[True, True, False]"])
    )
    assert both.flops == 2 * fwd
    go, x, w = 2 * 8 * 64, 2 * 3 * 256, 8 * 27
    assert both.bytes_moved == (go + 2 * (w + x)) * 4
    only_w = op_cost(
        make_op("aten::convolution_backward", dims, types, conc + ["[False, True, True]"])
    )
    assert only_w.flops == fwd
    assert only_w.bytes_moved == (go + x + w + 8) * 4


def test_sdpa_forward_and_backward():
    q, k, v = [2, 4, 10, 8], [2, 4, 12, 8], [2, 4, 12, 16]
    c = op_cost(make_op("aten::scaled_dot_product_attention", [q, k, v], [BF16] * 3))
    assert c.flops == 2 * 8 * 10 * 12 * 8 + 2 * 8 * 10 * 12 * 16
    assert (
        c.bytes_moved == (2 * 4 * 10 * 8 + 2 * 4 * 12 * 8 + 2 * 4 * 12 * 16 + 2 * 4 * 10 * 16) * 2
    )
    assert c.category == "attention"
    flash = op_cost(
        make_op(
            "aten::_scaled_dot_product_flash_attention",
            [q, k, v, [], []],
            [BF16] * 3 + ["Scalar", "Scalar"],
        )
    )
    assert flash.flops == c.flops
    go = [2, 4, 10, 16]
    b = op_cost(
        make_op(
            "aten::_scaled_dot_product_efficient_attention_backward",
            [go, q, k, v, [], go],
            [BF16] * 4 + ["", BF16],
        )
    )
    assert b.flops == 2 * 8 * 10 * 12 * (3 * 8 + 2 * 16)


def test_elementwise_add_fp32_is_one_twelfth():
    c = op_cost(make_op("aten::add", [[1000], [1000], []], [F32, F32, "Scalar"], ["", "", "1"]))
    assert c.flops == 1000
    assert c.bytes_moved == 12 * 1000
    assert c.flops / c.bytes_moved == pytest.approx(1 / 12)


def test_elementwise_relu_fp32_is_one_eighth_and_broadcast_counted_once():
    relu = op_cost(make_op("aten::relu", [[64, 64]], [F32]))
    assert relu.flops / relu.bytes_moved == pytest.approx(1 / 8)
    # Bias [1, 768, 1, 1] broadcast over [4, 768, 14, 14]: read once at its own size.
    c = op_cost(
        make_op("aten::add_", [[4, 768, 14, 14], [1, 768, 1, 1], []], [BF16, BF16, "Scalar"])
    )
    n = 4 * 768 * 14 * 14
    assert c.flops == n
    assert c.bytes_moved == (n + 768 + n) * 2  # in place: read self, read bias, write self
    eq = op_cost(make_op("aten::eq", [[1, 141], []], [I64, "Scalar"], ["", "1"]))
    assert eq.bytes_moved == 141 * 8 + 141 * 1  # bool output


def test_reductions_softmax_norms():
    s = op_cost(
        make_op(
            "aten::sum",
            [[32, 100], [], [], []],
            [F32, "ScalarList", "Scalar", ""],
            ["", "[1]", "False", ""],
        )
    )
    assert s.flops == 3200
    assert s.bytes_moved == (3200 + 32) * 4
    full = op_cost(make_op("aten::mean", [[32, 100], []], [F32, ""]))
    assert full.bytes_moved == (3200 + 1) * 4
    sm = op_cost(
        make_op(
            "aten::_softmax", [[8, 128], [], []], [F32, "Scalar", "Scalar"], ["", "-1", "False"]
        )
    )
    assert sm.flops == 5 * 1024
    assert sm.bytes_moved == 2 * 1024 * 4
    ln = op_cost(
        make_op(
            "aten::layer_norm",
            [[4, 197, 768], [], [768], [768], [], []],
            [BF16, "ScalarList", BF16, BF16, "Scalar", "Scalar"],
        )
    )
    n = 4 * 197 * 768
    assert ln.flops == 7 * n
    assert ln.bytes_moved == (2 * n + 2 * 768) * 2
    rms = op_cost(
        make_op("aten::rms_norm", [[16, 64], [], [], []], [F32, "ScalarList", "", "Scalar"])
    )
    assert rms.flops == 3 * 1024
    assert rms.category == "norm"


def test_embedding_and_copies_have_no_flops():
    e = op_cost(
        make_op(
            "aten::embedding",
            [[30522, 512], [1, 141], [], [], []],
            [BF16, I64, "Scalar", "Scalar", "Scalar"],
        )
    )
    assert e.flops == 0
    assert e.bytes_moved == 141 * 8 + 2 * 141 * 512 * 2
    cp = op_cost(make_op("aten::copy_", [[100, 10], [100, 10], []], [BF16, F32, "Scalar"]))
    assert (cp.flops, cp.bytes_moved) == (0, 1000 * 4 + 1000 * 2)
    # _to_copy to bfloat16 (ScalarType 15): read 4 B, write 2 B per element
    tc = op_cost(
        make_op(
            "aten::_to_copy",
            [[1000], [], [], [], [], [], []],
            [F32, "Scalar", "", "", "", "Scalar", ""],
            ["", "15", "", "", "", "False", ""],
        )
    )
    assert tc.bytes_moved == 1000 * 6
    assert tc.category == "copy"


def test_views_and_unknown_ops_have_no_formula():
    assert op_cost(make_op("aten::view", [[768], []], [BF16, "ScalarList"])) is None
    assert op_cost(make_op("aten::transpose", [[4, 5], [], []], [F32, "Scalar", "Scalar"])) is None
    assert op_cost(make_op("my_module.forward", [[4]], [F32])) is None
    assert not has_formula("aten::view")
    assert has_formula("aten::conv2d")


@pytest.mark.parametrize(
    "dims,types,concrete",
    [
        (None, None, None),
        ([[64, 32]], [F32], None),  # missing second operand
        ([[64, 32], [32, "x"]], [F32, F32], None),  # junk in dims
        ([[64, 32], [32, 48]], ["TensorList", F32], None),
        ([[2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []], [F32, F32] + [""] * 5, None),
    ],
)
def test_bad_shapes_give_none_not_errors(dims, types, concrete):
    op = Op(
        name="aten::mm" if dims is None or len(dims) < 3 else "aten::conv2d",
        kind="op",
        start_us=0,
        dur_us=1,
        pid=1,
        tid=1,
        input_dims=None if dims is None else tuple(dims),
        input_types=None if types is None else tuple(types),
        concrete_inputs=concrete,
    )
    assert op_cost(op) is None
