"""What an op or kernel is, by its name: a matmul/convolution, an elementwise or reduction op
(low arithmetic intensity), a cast, a copy or a collective. The diagnosis rules and the
timeline drawing (render/timeline.py) classify by these same names."""

from __future__ import annotations

import functools
import re

from gpuprof_nb.model.trace import Kernel

# Op names (normalised: after '::', lower case, no underscores) that run matmuls/convolutions.
_GEMM_OPS = frozenset(
    "mm addmm bmm baddbmm matmul linear conv1d conv2d conv3d convolution cudnnconvolution "
    "mkldnnconvolution convtranspose1d convtranspose2d convtranspose3d convolutionbackward "
    "cudnnconvolutiontranspose einsum addmv mv mkldnnlinear addmmactivation tensordot "
    "scaleddotproductattention scaleddotproductflashattention scaleddotproductefficientattention "
    "scaleddotproductcudnnattention flashattentionforward flashattentionbackward "
    "efficientattentionforward efficientattentionbackward linearbackward".split()
)


# Low arithmetic intensity ops: elementwise, activations, norms, softmax, reductions.
_ELEMENTWISE_OPS = frozenset(
    "add sub rsub mul div neg abs exp exp2 expm1 log log1p log2 sin cos tan tanh sigmoid relu "
    "relu6 gelu silu mish elu leakyrelu hardtanh hardswish hardsigmoid softplus pow sqrt rsqrt "
    "reciprocal clamp clampmin clampmax where maskedfill fill zero addcmul addcdiv lerp softmax "
    "logsoftmax layernorm nativelayernorm batchnorm nativebatchnorm cudnnbatchnorm groupnorm "
    "nativegroupnorm rmsnorm fusedrmsnorm dropout nativedropout sum mean var std max min amax "
    "amin norm linalgvectornorm cumsum prod threshold thresholdbackward gelubackward "
    "silubackward sigmoidbackward tanhbackward softmaxbackwarddata logsoftmaxbackwarddata "
    "nativelayernormbackward nativebatchnormbackward square erf floor ceil round sign minimum "
    "maximum remainder fmod eq ne lt gt le ge logicaland logicalor logicalnot hardtanhbackward "
    "nativedropoutbackward fusedadam fusedadamw mselossforward nlllossforward".split()
)


_CAST_OPS = frozenset({"to", "tocopy", "copy", "typeas"})


# Kernel-name marks of matmuls and convolutions, as the libraries name their kernels (cuBLAS
# sgemm/gemmSN/gemmk1, CUTLASS and xmma tensor-core tiles, cuDNN implicit-gemm "scudnn",
# winograd, dgrad/wgrad, MIOpen igemm, rocBLAS/Tensile "Cijk_", composable-kernel grouped_conv,
# attention, Triton templates). Library names alone are not marks: cuDNN also runs batchnorm,
# pooling, softmax and layout transposes, cuBLAS split-K reductions, epilogues and gemv, and
# fbgemm_gpu (whose name contains "gemm") embedding lookups and permutes.
_GEMM_KERNEL_MARKS = (
    "gemm",
    "xmma",
    "s1688",
    "s16816",
    "h1688",
    "h16816",
    "s161616",
    "cijk_",
    "convolve",
    "conv2d",
    "conv3d",
    "grouped_conv",
    "conv_fwd",
    "conv_bwd",
    "dgrad",
    "wgrad",
    "fprop",
    "scudnn",
    "hcudnn",
    "winograd",
    "flash",
    "fmha",
    "attention",
    "triton_tem",
    "matmul",
)


# cuDNN's FFT convolution kernels are named fft2d_r2c_...: a convolution only inside cuDNN.
_CUDNN_CONV_MARKS = ("fft", "conv")


# Helper kernels that sit next to GEMMs in the same libraries but only move, scale or reduce
# data (low arithmetic intensity). Matched on the function name before its template and
# argument lists, where a real GEMM's template arguments may mention an epilogue or transpose.
_NOT_GEMM_KERNEL_MARKS = (
    "gemv",
    "bn_fw",
    "bn_bw",
    "batchnorm",
    "batch_norm",
    "nchwtonhwc",
    "nhwctonchw",
    "transpose",
    "splitkreduce",
    "reducesplitk",
    "epilogue",
    "offsets",
    "scalepackedtensor",
    "im2col",
    "scal_kernel",
    "pool",
    "softmax",
)


_COMM_KERNEL_MARKS = ("nccl", "rccl", "gloo")
# Device-side waits and event records (MTIA's device events, streams waiting on events):
# time on the device that is neither math nor memory traffic.
_WAIT_KERNEL_PREFIXES = ("event_wait", "event_record", "stream wait event")


@functools.lru_cache(maxsize=8192)
@functools.lru_cache(maxsize=8192)
def op_class(name: str) -> str:
    """Return 'gemm', 'elementwise', 'cast' or 'other' for a torch op name (forward ops and
    autograd `evaluate_function: XBackward0` nodes)."""
    base = name
    if "evaluate_function:" in base:
        base = base.split("evaluate_function:", 1)[1].strip()
        cut = base.find("Backward")
        base = base[:cut] if cut > 0 else base
    base = base.rsplit("::", 1)[-1].lower().replace("_", "").strip()
    if base.startswith("foreach"):
        return "elementwise"
    if base in _GEMM_OPS:
        return "gemm"
    if base in _CAST_OPS:
        return "cast"
    if base in _ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


def kernel_class(kernel: Kernel) -> str:
    """Return 'comm', 'gemm', 'copy', 'wait' or 'elementwise' for a device activity. Kernels
    that are neither collectives, matmuls/convolutions nor device-side waits are, in
    practice, elementwise, reduction, norm or copy kernels: low arithmetic intensity."""
    if kernel.kind != "kernel":
        return "copy"
    return kernel_name_class(kernel.name)


@functools.lru_cache(maxsize=4096)
def kernel_name_class(name: str) -> str:
    """Return 'comm', 'gemm', 'wait' or 'elementwise' for a kernel name (see kernel_class)."""
    # Traces repeat a few hundred kernel names thousands of times: classify each name once.
    n = name.lower()
    if any(m in n for m in _COMM_KERNEL_MARKS):
        return "comm"
    if n.startswith(_WAIT_KERNEL_PREFIXES):
        return "wait"
    if _is_gemm_kernel_name(n):
        return "gemm"
    return "elementwise"


def _is_gemm_kernel_name(lower_name: str) -> bool:
    """Return whether a lower-cased kernel name is a matmul or convolution by its name."""
    head = re.split(r"[<(]", lower_name, maxsplit=1)[0]
    # A mangled name (_ZN...) has no separate template list: its "head" is everything.
    if not head.startswith("_z") and any(m in head for m in _NOT_GEMM_KERNEL_MARKS):
        return False
    # "fbgemm" names the library, not the operation: look past it.
    n = lower_name.replace("fbgemm", "")
    if any(m in n for m in _GEMM_KERNEL_MARKS):
        return True
    return "cudnn" in n and any(m in head for m in _CUDNN_CONV_MARKS)


# Host-side ranges of collectives: gloo and NCCL record_function annotations, c10d ops.
HOST_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::", "mpi:", "ucc:")


def is_host_collective(name: str) -> bool:
    """Whether a host op or annotation is a collective (`gloo:all_reduce`, `c10d::allreduce_`)."""
    return name.lower().startswith(HOST_COLLECTIVE_PREFIXES)
