"""FLOPs and minimum bytes of one recorded op, derived after the run from its Input Dims,
Input type and Concrete Inputs (what `record_shapes=True` stores). No dispatch mode, no torch.

Conventions (docs/roofline.md has the table):
- A multiply-add is 2 FLOPs. GEMM-class counts follow torch.utils.flop_counter (bias adds and
  alpha/beta scaling are not counted; causal attention is counted as full).
- Bytes are the minimum algorithmic traffic: every tensor input read once at its own size
  (broadcast inputs once), every output written once; views move nothing.
- Elementwise ops cost 1 FLOP per output element; reductions 1 per input element; softmax 5,
  layer/group/batch norm 5 (+2 with an affine weight), RMS norm 3 (+1 with a weight).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuprof_nb.model.trace import Op

# Input type string (as the profiler writes it) -> (short dtype name, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "c10::Half": ("fp16", 2),
    "c10::BFloat16": ("bf16", 2),
    "long int": ("int64", 8),
    "long": ("int64", 8),
    "int": ("int32", 4),
    "short int": ("int16", 2),
    "short": ("int16", 2),
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
    "c10::complex<c10::Half>": ("complex32", 4),
    "c10::Float8_e4m3fn": ("fp8_e4m3", 1),
    "c10::Float8_e5m2": ("fp8_e5m2", 1),
    "c10::Float8_e4m3fnuz": ("fp8_e4m3", 1),
    "c10::Float8_e5m2fnuz": ("fp8_e5m2", 1),
}

# c10::ScalarType numbers, as Concrete Inputs show a dtype argument ("15" is bfloat16).
SCALAR_TYPES: dict[int, tuple[str, int]] = {
    0: ("uint8", 1),
    1: ("int8", 1),
    2: ("int16", 2),
    3: ("int32", 4),
    4: ("int64", 8),
    5: ("fp16", 2),
    6: ("fp32", 4),
    7: ("fp64", 8),
    8: ("complex32", 4),
    9: ("complex64", 8),
    10: ("complex128", 16),
    11: ("bool", 1),
    15: ("bf16", 2),
    23: ("fp8_e5m2", 1),
    24: ("fp8_e4m3", 1),
}

Category = str  # "gemm" | "conv" | "attention" | "elementwise" | "reduction" | "softmax"
#                 | "norm" | "embedding" | "copy"


@dataclass(frozen=True, slots=True)
class OpCost:
    """FLOPs and minimum bytes moved by one call of an op, and where they came from."""

    flops: int
    bytes_moved: int
    category: Category
    dtype: str
    flop_source: str
    bytes_model: str


@dataclass(frozen=True, slots=True)
class _Tensor:
    dims: tuple[int, ...]
    dtype: str
    itemsize: int

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def _tensor_at(op: Op, i: int) -> _Tensor | None:
    """Return input i as a tensor, None when it is not a tensor (Scalar, list, None)."""
    dims_all, types = op.input_dims, op.input_types
    if dims_all is None or types is None or i >= len(dims_all) or i >= len(types):
        return None
    dtype = DTYPES.get(str(types[i]))
    dims = dims_all[i]
    if dtype is None or not isinstance(dims, (list, tuple)):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return None
    return _Tensor(tuple(dims), dtype[0], dtype[1])


def _tensors(op: Op) -> list[_Tensor]:
    """Return every tensor input, in order (non-tensors skipped)."""
    n = len(op.input_dims or ())
    return [t for t in (_tensor_at(op, i) for i in range(n)) if t is not None]


def _concrete(op: Op, i: int) -> Any:
    """Return Concrete Input i parsed as a Python literal ('[1, 1]' -> [1, 1], 'False' ->
    False, '15' -> 15); None when absent or not a literal."""
    values = op.concrete_inputs
    if values is None or i >= len(values):
        return None
    text = str(values[i]).strip()
    if not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _int_list(value: Any, length: int) -> tuple[int, ...] | None:
    """Return value as `length` ints (a single int is repeated), None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * length
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        if len(value) == length:
            return tuple(value)
        if len(value) == 1:
            return (value[0],) * length
    return None


def _name(op: Op) -> str:
    return op.name[6:] if op.name.startswith("aten::") else op.name


# ---------------------------------------------------------------- GEMM-class


def _gemm(flops: int, moved_elems: int, t: _Tensor, source: str, model: str) -> OpCost:
    return OpCost(flops, moved_elems * t.itemsize, "gemm", t.dtype, source, model)


def _mm(op: Op) -> OpCost | None:
    a, b = _tensor_at(op, 0), _tensor_at(op, 1)
    if a is None or b is None or len(a.dims) != 2 or len(b.dims) != 2:
        return None
    (m, k), (_, n) = a.dims, b.dims
    return _gemm(
        2 * m * k * n,
        m * k + k * n + m * n,
        a,
        "2*M*K*N from Input Dims",
        f"(MK+KN+MN) x {a.itemsize} B",
    )


def _addmm(op: Op) -> OpCost | None:
    bias, a, b = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if bias is None or a is None or b is None or len(a.dims) != 2 or len(b.dims) != 2:
        return None
    (m, k), (_, n) = a.dims, b.dims
    return _gemm(
        2 * m * k * n,
        m * k + k * n + m * n + bias.numel,
        a,
        "2*M*K*N from Input Dims (bias add not counted)",
        f"(MK+KN+MN+bias) x {a.itemsize} B",
    )


def _bmm(op: Op) -> OpCost | None:
    a, b = _tensor_at(op, 0), _tensor_at(op, 1)
    if a is None or b is None or len(a.dims) != 3 or len(b.dims) != 3:
        return None
    (bt, m, k), (_, _, n) = a.dims, b.dims
    return _gemm(
        2 * bt * m * k * n,
        bt * (m * k + k * n + m * n),
        a,
        "2*B*M*K*N from Input Dims",
        f"B(MK+KN+MN) x {a.itemsize} B",
    )


def _baddbmm(op: Op) -> OpCost | None:
    base, a, b = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if base is None or a is None or b is None or len(a.dims) != 3 or len(b.dims) != 3:
        return None
    (bt, m, k), (_, _, n) = a.dims, b.dims
    return _gemm(
        2 * bt * m * k * n,
        bt * (m * k + k * n + m * n) + base.numel,
        a,
        "2*B*M*K*N from Input Dims (added input not counted)",
        f"(B(MK+KN+MN)+input) x {a.itemsize} B",
    )


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """Return the broadcast of the shapes, None when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        size = 1
        for s in shapes:
            d = s[len(s) - ndim + i] if len(s) - ndim + i >= 0 else 1
            if d != 1:
                if size not in (1, d):
                    return None
                size = d
        out.append(size)
    return tuple(out)


def _matmul(op: Op) -> OpCost | None:
    a, b = _tensor_at(op, 0), _tensor_at(op, 1)
    if a is None or b is None or not a.dims or not b.dims:
        return None
    ad = a.dims if len(a.dims) > 1 else (1, a.dims[0])
    bd = b.dims if len(b.dims) > 1 else (b.dims[0], 1)
    batch = _broadcast(ad[:-2], bd[:-2])
    if batch is None or ad[-1] != bd[-2]:
        return None
    m, k, n = ad[-2], ad[-1], bd[-1]
    nb = math.prod(batch)
    return _gemm(
        2 * nb * m * k * n,
        a.numel + b.numel + nb * m * n,
        a,
        "2*batch*M*K*N from Input Dims (broadcast batch)",
        f"(A+B+out) x {a.itemsize} B",
    )


def _linear(op: Op) -> OpCost | None:
    x, w, bias = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if x is None or w is None or not x.dims or len(w.dims) not in (1, 2):
        return None
    k = x.dims[-1]
    n = w.dims[0] if len(w.dims) == 2 else 1
    rows = x.numel // k if k else 0
    extra = bias.numel if bias is not None else 0
    return _gemm(
        2 * rows * k * n,
        x.numel + w.numel + rows * n + extra,
        x,
        "2*rows*K*N from Input Dims (bias add not counted)",
        f"(input+weight+out{'+bias' if bias else ''}) x {x.itemsize} B",
    )


# ---------------------------------------------------------------- convolution


def _conv_out(
    spatial: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
) -> tuple[int, ...]:
    if transposed:
        return tuple(
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, k, s, p, d, op in zip(
                spatial, kernel, stride, padding, dilation, output_padding, strict=True
            )
        )
    return tuple(
        (i + 2 * p - d * (k - 1) - 1) // s + 1
        for i, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)
    )


def _conv_cost(
    op: Op,
    x: _Tensor,
    w: _Tensor,
    bias_numel: int,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
) -> OpCost | None:
    nsp = len(x.dims) - 2
    if nsp < 1 or len(w.dims) != nsp + 2:
        return None
    kernel = w.dims[2:]
    if padding == "valid":
        padding = 0
    st = _int_list(stride, nsp)
    dl = _int_list(dilation, nsp) if dilation is not None else (1,) * nsp
    if padding == "same" and st is not None and dl is not None:
        out_sp: tuple[int, ...] = tuple(x.dims[2:])
    else:
        pd = _int_list(padding, nsp)
        opd = _int_list(output_padding, nsp) if output_padding is not None else (0,) * nsp
        if st is None or pd is None or dl is None or opd is None:
            return None
        out_sp = _conv_out(x.dims[2:], kernel, st, pd, dl, transposed, opd)
    if any(s <= 0 for s in out_sp):
        return None
    per_in = math.prod(w.dims[1:])  # Cin/groups * prod(kernel), or Cout/groups if transposed
    if transposed:
        out_c = w.dims[1] * (x.dims[1] // w.dims[0] if w.dims[0] else 1)
        out_numel = x.dims[0] * out_c * math.prod(out_sp)
        flops = 2 * x.numel * per_in
    else:
        out_numel = x.dims[0] * w.dims[0] * math.prod(out_sp)
        flops = 2 * out_numel * per_in
    moved = x.numel + w.numel + out_numel + bias_numel
    return OpCost(
        flops,
        moved * x.itemsize,
        "conv",
        x.dtype,
        f"2*N*Cout*out_spatial*Cin/g*kernel from Input Dims + stride/padding ({nsp}d)",
        f"(input+weight+out{'+bias' if bias_numel else ''}) x {x.itemsize} B",
    )


def _conv_nd(op: Op) -> OpCost | None:
    # conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups)
    x, w, b = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if x is None or w is None:
        return None
    return _conv_cost(
        op,
        x,
        w,
        b.numel if b else 0,
        _concrete(op, 3),
        _concrete(op, 4),
        _concrete(op, 5),
        False,
        None,
    )


def _convolution(op: Op) -> OpCost | None:
    # (_)convolution(input, weight, bias, stride, padding, dilation, transposed,
    #                output_padding, groups, ...)
    x, w, b = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if x is None or w is None:
        return None
    transposed = _concrete(op, 6) is True
    return _conv_cost(
        op,
        x,
        w,
        b.numel if b else 0,
        _concrete(op, 3),
        _concrete(op, 4),
        _concrete(op, 5),
        transposed,
        _concrete(op, 7),
    )


def _conv_transpose_nd(op: Op) -> OpCost | None:
    # conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    x, w, b = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if x is None or w is None:
        return None
    return _conv_cost(
        op,
        x,
        w,
        b.numel if b else 0,
        _concrete(op, 3),
        _concrete(op, 4),
        _concrete(op, 7),
        True,
        _concrete(op, 5),
    )


def _cudnn_convolution(op: Op) -> OpCost | None:
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, ...): padding first
    x, w = _tensor_at(op, 0), _tensor_at(op, 1)
    if x is None or w is None:
        return None
    return _conv_cost(
        op, x, w, 0, _concrete(op, 3), _concrete(op, 2), _concrete(op, 4), False, None
    )


def _convolution_backward(op: Op) -> OpCost | None:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    go, x, w = _tensor_at(op, 0), _tensor_at(op, 1), _tensor_at(op, 2)
    if go is None or x is None or w is None or len(w.dims) < 3 or not w.dims[0]:
        return None
    transposed = _concrete(op, 7) is True
    mask = _concrete(op, 10)
    if not (isinstance(mask, (list, tuple)) and len(mask) == 3):
        mask = [True, True, False]
        known = " (output_mask unknown: input and weight grads assumed)"
    else:
        known = ""
    per_in = math.prod(w.dims[1:])
    # Same FLOPs as the forward for each gradient computed: the forward output is grad_output.
    fwd = 2 * (x.numel if transposed else go.numel) * per_in
    flops = fwd * (int(bool(mask[0])) + int(bool(mask[1])))
    moved = go.numel
    if mask[0]:
        moved += w.numel + x.numel  # read weight, write grad_input
    if mask[1]:
        moved += x.numel + w.numel  # read input, write grad_weight
    if mask[2]:
        moved += go.dims[1] if len(go.dims) > 1 else 0
    return OpCost(
        flops,
        moved * go.itemsize,
        "conv",
        go.dtype,
        "forward conv FLOPs per gradient in output_mask, from Input Dims" + known,
        f"(grad_out + per grad: operand read + grad written) x {go.itemsize} B",
    )


# ---------------------------------------------------------------- attention


def _qkv(op: Op, first: int) -> tuple[_Tensor, _Tensor, _Tensor] | None:
    q, k, v = (_tensor_at(op, first + i) for i in range(3))
    if q is None or k is None or v is None or min(len(q.dims), len(k.dims), len(v.dims)) < 2:
        return None
    return q, k, v


def _sdpa(op: Op) -> OpCost | None:
    qkv = _qkv(op, 0)
    if qkv is None:
        return None
    q, k, v = qkv
    batch = math.prod(q.dims[:-2])
    lq, e = q.dims[-2:]
    s, ev = k.dims[-2], v.dims[-1]
    flops = 2 * batch * lq * s * e + 2 * batch * lq * s * ev
    moved = q.numel + k.numel + v.numel + batch * lq * ev
    return OpCost(
        flops,
        moved * q.itemsize,
        "attention",
        q.dtype,
        "2*B*H*L*S*(E+Ev) from Input Dims (QK^T and PV; causal counted full)",
        f"(Q+K+V+out) x {q.itemsize} B",
    )


def _sdpa_backward(op: Op) -> OpCost | None:
    go = _tensor_at(op, 0)
    qkv = _qkv(op, 1)
    if go is None or qkv is None:
        return None
    q, k, v = qkv
    batch = math.prod(q.dims[:-2])
    lq, e = q.dims[-2:]
    s, ev = k.dims[-2], v.dims[-1]
    flops = 2 * batch * lq * s * (3 * e + 2 * ev)
    moved = 2 * go.numel + 2 * (q.numel + k.numel + v.numel)
    return OpCost(
        flops,
        moved * q.itemsize,
        "attention",
        q.dtype,
        "2*B*H*L*S*(3E+2Ev) from Input Dims (scores recomputed; 5 matmuls)",
        f"(grad_out+out+Q+K+V+dQ+dK+dV) x {q.itemsize} B",
    )


# ---------------------------------------------------------------- memory-bound families

_COMPARISONS = frozenset(
    {
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "isnan",
        "isinf",
        "logical_not",
        "logical_and",
        "logical_or",
    }
)
ELEMENTWISE = (
    frozenset(
        {
            "add",
            "sub",
            "rsub",
            "mul",
            "div",
            "neg",
            "abs",
            "relu",
            "gelu",
            "silu",
            "sigmoid",
            "tanh",
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "reciprocal",
            "pow",
            "square",
            "clamp",
            "clamp_min",
            "clamp_max",
            "maximum",
            "minimum",
            "where",
            "leaky_relu",
            "hardtanh",
            "hardswish",
            "hardsigmoid",
            "elu",
            "mish",
            "softplus",
            "erf",
            "sin",
            "cos",
            "threshold_backward",
            "gelu_backward",
            "silu_backward",
            "sigmoid_backward",
            "tanh_backward",
            "hardtanh_backward",
            "addcmul",
            "addcdiv",
            "lerp",
            "masked_fill",
            "sign",
            "floor",
            "ceil",
            "round",
            "exp2",
            "log1p",
            "expm1",
        }
    )
    | _COMPARISONS
)
REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "prod",
        "norm",
        "linalg_vector_norm",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "argmax",
        "argmin",
        "logsumexp",
        "any",
        "all",
        "nansum",
        "count_nonzero",
    }
)
SOFTMAX = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"})
NORMS = {
    # name: (index of the affine weight input or None, FLOPs per element without / with it)
    "layer_norm": (2, 5, 7),
    "native_layer_norm": (2, 5, 7),
    "batch_norm": (1, 5, 7),
    "native_batch_norm": (1, 5, 7),
    "_batch_norm_impl_index": (1, 5, 7),
    "cudnn_batch_norm": (1, 5, 7),
    "_native_batch_norm_legit": (1, 5, 7),
    "_native_batch_norm_legit_no_training": (1, 5, 7),
    "miopen_batch_norm": (1, 5, 7),
    "group_norm": (2, 5, 7),
    "native_group_norm": (1, 5, 7),
    "rms_norm": (2, 3, 4),
    "_fused_rms_norm": (2, 3, 4),
}


def _elementwise(op: Op) -> OpCost | None:
    ts = _tensors(op)
    if not ts:
        return None
    out_shape = _broadcast(*(t.dims for t in ts))
    if out_shape is None:
        return None
    base = max(ts, key=lambda t: t.numel)
    name = _name(op)
    inplace = name.endswith("_") and not name.startswith("_")
    out_numel = math.prod(out_shape)
    out_isz = 1 if name.rstrip("_") in _COMPARISONS else base.itemsize
    moved = sum(t.nbytes for t in ts) + out_numel * out_isz
    return OpCost(
        out_numel,
        moved,
        "elementwise",
        base.dtype,
        "1 FLOP per output element (broadcast shape of Input Dims)",
        "each input read once at its own size + output written"
        + (" (in place: read+write)" if inplace else ""),
    )


def _reduction(op: Op) -> OpCost | None:
    x = _tensor_at(op, 0)
    if x is None:
        return None
    dim = _concrete(op, 1)
    keep = x.dims
    if isinstance(dim, int) and not isinstance(dim, bool):
        dim = [dim]
    if isinstance(dim, (list, tuple)) and dim and all(isinstance(d, int) for d in dim):
        nd = len(keep)
        drop = {d % nd for d in dim} if nd else set()
        out_numel = math.prod(s for i, s in enumerate(keep) if i not in drop)
        shape_note = "reduced dims from Concrete Inputs"
    else:
        out_numel = 1
        shape_note = "full reduction assumed (no dim recorded)"
    return OpCost(
        x.numel,
        (x.numel + out_numel) * x.itemsize,
        "reduction",
        x.dtype,
        f"1 FLOP per input element; {shape_note}",
        "input read + output written",
    )


def _softmax(op: Op) -> OpCost | None:
    x = _tensor_at(op, 0)
    if x is None:
        return None
    return OpCost(
        5 * x.numel,
        2 * x.nbytes,
        "softmax",
        x.dtype,
        "5 FLOPs per element (max, sub, exp, sum, div)",
        "input read + output written",
    )


def _softmax_backward(op: Op) -> OpCost | None:
    g = _tensor_at(op, 0)
    if g is None:
        return None
    return OpCost(
        3 * g.numel,
        3 * g.nbytes,
        "softmax",
        g.dtype,
        "3 FLOPs per element (mul, sum, sub)",
        "grad and output read + grad written",
    )


def _norm(op: Op) -> OpCost | None:
    x = _tensor_at(op, 0)
    if x is None:
        return None
    w_index, plain, affine = NORMS[_name(op)]
    has_w = w_index is not None and _tensor_at(op, w_index) is not None
    per = affine if has_w else plain
    moved = sum(t.nbytes for t in _tensors(op)) + x.nbytes
    return OpCost(
        per * x.numel,
        moved,
        "norm",
        x.dtype,
        f"{per} FLOPs per element ({'with' if has_w else 'without'} affine weight)",
        "input and parameters read once + output written (statistics ignored)",
    )


def _embedding(op: Op) -> OpCost | None:
    w, idx = _tensor_at(op, 0), _tensor_at(op, 1)
    if w is None or idx is None or len(w.dims) != 2:
        return None
    rows = idx.numel * w.dims[1]
    return OpCost(
        0,
        idx.nbytes + 2 * rows * w.itemsize,
        "embedding",
        w.dtype,
        "no FLOPs (a gather)",
        "indices read + gathered rows read and written",
    )


def _copy_(op: Op) -> OpCost | None:
    dst, src = _tensor_at(op, 0), _tensor_at(op, 1)
    if dst is None or src is None:
        return None
    return OpCost(
        0,
        src.nbytes + dst.nbytes,
        "copy",
        src.dtype,
        "no FLOPs",
        "source read + destination written",
    )


def _to_copy(op: Op) -> OpCost | None:
    x = _tensor_at(op, 0)
    if x is None:
        return None
    target = _concrete(op, 1)
    out_isz = x.itemsize
    if isinstance(target, int) and not isinstance(target, bool) and target in SCALAR_TYPES:
        out_isz = SCALAR_TYPES[target][1]
    return OpCost(
        0,
        x.numel * (x.itemsize + out_isz),
        "copy",
        x.dtype,
        "no FLOPs",
        "input read + converted output written",
    )


def _clone(op: Op) -> OpCost | None:
    x = _tensor_at(op, 0)
    if x is None:
        return None
    return OpCost(0, 2 * x.nbytes, "copy", x.dtype, "no FLOPs", "input read + copy written")


_FORMULAS: dict[str, Callable[[Op], OpCost | None]] = {
    "mm": _mm,
    "addmm": _addmm,
    "bmm": _bmm,
    "baddbmm": _baddbmm,
    "matmul": _matmul,
    "linear": _linear,
    "conv1d": _conv_nd,
    "conv2d": _conv_nd,
    "conv3d": _conv_nd,
    "conv_transpose1d": _conv_transpose_nd,
    "conv_transpose2d": _conv_transpose_nd,
    "conv_transpose3d": _conv_transpose_nd,
    "convolution": _convolution,
    "_convolution": _convolution,
    "cudnn_convolution": _cudnn_convolution,
    "convolution_backward": _convolution_backward,
    "scaled_dot_product_attention": _sdpa,
    "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_cudnn_attention": _sdpa,
    "_scaled_dot_product_attention_math": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "_scaled_dot_product_fused_attention_overrideable": _sdpa,
    "_scaled_dot_product_flash_attention_backward": _sdpa_backward,
    "_scaled_dot_product_efficient_attention_backward": _sdpa_backward,
    "_scaled_dot_product_cudnn_attention_backward": _sdpa_backward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
    "_softmax_backward_data": _softmax_backward,
    "embedding": _embedding,
    "copy_": _copy_,
    "_to_copy": _to_copy,
    "clone": _clone,
}
for _n in SOFTMAX:
    _FORMULAS[_n] = _softmax
for _n in NORMS:
    _FORMULAS[_n] = _norm
for _n in REDUCTIONS:
    _FORMULAS[_n] = _reduction
for _n in ELEMENTWISE:
    _FORMULAS[_n] = _elementwise
    _FORMULAS[_n + "_"] = _elementwise

# Ops that either copy (through a child copy_/_to_copy) or return their input unchanged:
# their cost is their children's, and nothing when they did not copy.
COPY_WRAPPERS = frozenset({"aten::to", "aten::contiguous", "aten::type_as", "aten::reshape"})


def has_formula(name: str) -> bool:
    """Return True when op `name` ('aten::mm') has a FLOP/byte formula here."""
    return name.startswith("aten::") and name[6:] in _FORMULAS


def op_cost(op: Op) -> OpCost | None:
    """Return the FLOPs and minimum bytes of one call of `op`, None when the op has no
    formula or its recorded shapes do not fit one (no Input Dims, unexpected arity)."""
    if not op.name.startswith("aten::"):
        return None
    formula = _FORMULAS.get(op.name[6:])
    if formula is None:
        return None
    try:
        return formula(op)
    except (TypeError, ValueError, IndexError, ZeroDivisionError, KeyError):
        # A recording with shapes we do not understand is unmodelled, never a crash.
        return None
