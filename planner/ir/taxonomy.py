"""Op taxonomy as data: aten op -> category and FLOP rule.

Every entry is (op names, category, FLOP rule, why). An op missing from the table is
captured as `Category.OPAQUE` with a warning naming it: the planner never fuses it.
Ops known to run as library kernels that are not fused (sorting, selection, counting) are
listed as OPAQUE too, so they cost what they compute and raise no warning.

FLOP conventions (documented here once, tested in tests/test_taxonomy.py):
- matmul-like: exactly 2*M*N*K multiply-adds per output tile (plus M*N for a bias add);
  einsum: 2 per point of its index space (1 when nothing is summed);
  convolution: 2 * out_elements * (C_in/groups * prod(kernel)) (+ out_elements for bias);
  attention (sdpa): 2*B*H*L*S*E for Q@K^T, 2*B*H*L*S*Ev for P@V, 5*B*H*L*S for the softmax.
- pointwise: a count per output element: 1 for +, -, *, /, max, min, abs, neg, relu, where,
  clamp and friends; transcendental functions (exp, log, erf, tanh, sqrt, rsqrt, sin, cos)
  count 1 each plus the arithmetic around them: sigmoid = 1/(1+exp(-x)) -> 4,
  silu = x*sigmoid(x) -> 5, gelu (erf form 0.5*x*(1+erf(x/sqrt2))) -> 5, gelu (tanh form)
  -> 9, softplus -> 3. Casts and copies: 0.
- reductions: 1 per input element (sum, amax, mean; mean adds 1 per output element),
  var/std: 3 per input element (subtract, square, accumulate) + 1 per output element.
- softmax / log_softmax: 5 per element (max, subtract, exp, sum, divide or log).
- layer_norm / group_norm: 8 per element (mean 1, variance 3, normalize 2, affine 2);
  rms_norm: 4 per element (square, accumulate, scale, weight); batch_norm in inference:
  4 per element (subtract, scale, weight, bias), training adds 4 for the statistics.
- pooling: prod(kernel) per output element (+1 for the average's divide); adaptive pooling:
  1 per input element.
- resampling: 2*taps - 1 per output element (linear 3, bilinear 7, trilinear 15, bicubic
  31), nearest 0: index remappings (COPY) that load `taps` input elements each.
- sorting, top-k and counting (OPAQUE, never fused): 1 per input element counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.ir.graph import Category, TensorInfo

Ins = Sequence[TensorInfo | None]
Outs = Sequence[TensorInfo]
Args = Mapping[str, Any]
FlopRule = Callable[[Ins, Outs, Args], int]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def per_out(k: float) -> FlopRule:
    """k FLOPs per output element (summed over all outputs)."""
    return lambda ins, outs, args: int(k * sum(o.numel for o in outs))


def per_in(k: float, k_out: float = 0.0) -> FlopRule:
    """k FLOPs per element of the first input, plus k_out per output element."""
    return lambda ins, outs, args: int(
        k * (ins[0].numel if ins and ins[0] is not None else 0) + k_out * sum(o.numel for o in outs)
    )


def zero(ins: Ins, outs: Outs, args: Args) -> int:
    return 0


def _mm(ins: Ins, outs: Outs, args: Args) -> int:
    """mm / bmm / matmul: 2 * out_elements * K, K the contracted size of the first input."""
    a = ins[0]
    assert a is not None
    k = a.shape[-1]
    return 2 * outs[0].numel * k


def _addmm(ins: Ins, outs: Outs, args: Args) -> int:
    """addmm / baddbmm (bias, a, b): the product plus one add per output element."""
    a = ins[1]
    assert a is not None
    return 2 * outs[0].numel * a.shape[-1] + outs[0].numel


def _linear(ins: Ins, outs: Outs, args: Args) -> int:
    """linear(x, W[N,K], b): 2*M*N*K, plus M*N for the bias."""
    x = ins[0]
    assert x is not None
    bias = len(ins) > 2 and ins[2] is not None
    return 2 * outs[0].numel * x.shape[-1] + (outs[0].numel if bias else 0)


def _conv(ins: Ins, outs: Outs, args: Args) -> int:
    """conv(x, W[Cout, Cin/g, *k], b): 2 * out_elements * prod(W.shape[1:]) (+ bias)."""
    w = ins[1]
    assert w is not None
    bias = len(ins) > 2 and ins[2] is not None
    return 2 * outs[0].numel * _numel(w.shape[1:]) + (outs[0].numel if bias else 0)


def _einsum(ins: Ins, outs: Outs, args: Args) -> int:
    """einsum: one multiply-add (2 FLOPs) per point of the index space when some index is
    summed over, one multiply per point when none is (an outer or elementwise product)."""
    eq = str(args.get("equation", "")).replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(terms, ins):
        if t is None or "." in term or len(term) != len(t.shape):
            return 2 * sum(o.numel for o in outs)  # ellipses: at least the outputs' work
        for letter, size in zip(term, t.shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    space = _numel(list(sizes.values()))
    # an implicit output keeps the letters seen once: the others are summed
    summed = set(sizes) - set(rhs) if "->" in eq else {c for c in sizes if lhs.count(c) > 1}
    return (2 if summed else 1) * space


def _sdpa(ins: Ins, outs: Outs, args: Args) -> int:
    """Attention: Q@K^T and P@V as GEMMs, the softmax at 5 FLOPs per score."""
    q, k, v = ins[0], ins[1], ins[2]
    assert q is not None and k is not None and v is not None
    batch = _numel(q.shape[:-2])
    lq, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * batch * lq * s * e + 2 * batch * lq * s * ev + 5 * batch * lq * s


def _pool(extra: int) -> FlopRule:
    def rule(ins: Ins, outs: Outs, args: Args) -> int:
        kernel = args.get("kernel_size", (1,))
        kernel = tuple(kernel) if isinstance(kernel, list | tuple) else (kernel,)
        spatial = len(outs[0].shape) - 2  # N, C, *spatial
        if len(kernel) == 1 and spatial > 1:
            kernel = kernel * spatial
        return (_numel(kernel) + extra) * outs[0].numel

    return rule


def _batch_norm(ins: Ins, outs: Outs, args: Args) -> int:
    training = bool(args.get("training", False))
    return (8 if training else 4) * outs[0].numel


@dataclass(frozen=True)
class OpRule:
    ops: tuple[str, ...]  # overload packets, e.g. ("linear",)
    category: Category
    flops: FlopRule
    why: str


# Convolutions: cuDNN runs them in TF32 for float32 by default, unlike matmuls
# (planner.hardware.tf32_allowed), so the roofline rates them apart.
CONV_OPS = ("conv1d", "conv2d", "conv3d", "convolution", "_convolution")

# fmt: off
RULES: tuple[OpRule, ...] = (
    # --- compute anchors: tensor-core bound, realized by cuBLAS/cuDNN or a GEMM template
    OpRule(("mm", "bmm", "matmul"), Category.COMPUTE, _mm, "GEMM: 2MNK"),
    OpRule(("addmm", "baddbmm"), Category.COMPUTE, _addmm, "GEMM with a fused bias add"),
    # a mixture of experts' (S, K) tokens against (E, K, N) weights, each token one expert
    OpRule(("_grouped_mm", "grouped_mm", "grouped_mm_fallback"), Category.COMPUTE, _mm,
           "grouped GEMM: 2SNK"),
    OpRule(("linear",), Category.COMPUTE, _linear, "x @ W^T + b as one GEMM"),
    OpRule(CONV_OPS, Category.COMPUTE, _conv, "convolution: 2 * out * Cin/g * prod(k)"),
    OpRule(("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_flash_attention_for_cpu"),
           Category.COMPUTE, _sdpa, "fused attention: two GEMMs and a softmax in one kernel"),
    OpRule(("einsum",), Category.COMPUTE, _einsum,
           "a contraction: 2 per point of the index space (bmm-like)"),
    # --- norms and softmax: reductions with elementwise prologue/epilogue
    OpRule(("layer_norm", "native_layer_norm", "group_norm", "native_group_norm"),
           Category.NORM, per_out(8), "mean, variance, normalize, affine"),
    OpRule(("rms_norm", "_fused_rms_norm"), Category.NORM, per_out(4), "square-mean, scale"),
    OpRule(("_weight_norm", "_weight_norm_interface"), Category.NORM, per_out(4),
           "weight normalization g * v / ||v||: square, accumulate, divide, scale"),
    OpRule(("batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
            "native_batch_norm", "_batch_norm_with_update", "_batch_norm_no_update"),
           Category.NORM, _batch_norm, "inference BN is an affine map per channel"),
    OpRule(("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"),
           Category.SOFTMAX, per_in(5), "max, subtract, exp, sum, divide"),
    # --- reductions
    OpRule(("sum", "amax", "amin", "max", "min", "prod", "argmax", "argmin", "any", "all",
            "logsumexp", "norm", "linalg_vector_norm"),
           Category.REDUCTION, per_in(1), "one accumulate per input element"),
    OpRule(("mean",), Category.REDUCTION, per_in(1, 1), "sum, then one divide per output"),
    OpRule(("var", "std", "var_mean", "std_mean"), Category.REDUCTION, per_in(3, 1),
           "subtract, square, accumulate; divide per output"),
    OpRule(("cumsum", "cumprod"), Category.REDUCTION, per_in(1), "a scan: one op per element"),
    OpRule(("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices"),
           Category.REDUCTION, _pool(0), "window max: prod(kernel) per output"),
    OpRule(("avg_pool1d", "avg_pool2d", "avg_pool3d"), Category.REDUCTION, _pool(1),
           "window sum and divide"),
    OpRule(("adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
            "adaptive_max_pool2d"), Category.REDUCTION, per_in(1), "one op per input element"),
    # --- pointwise (elementwise maps, incl. broadcasting binaries)
    OpRule(("add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "clamp", "clamp_min",
            "clamp_max", "clip", "where", "maximum", "minimum", "masked_fill", "eq", "ne", "lt",
            "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_and",
            "bitwise_or", "bitwise_not", "sign", "floor", "ceil", "round", "trunc", "remainder",
            "fmod", "hardtanh", "leaky_relu", "threshold", "square", "reciprocal",
            "addcmul", "addcdiv", "lerp", "pow", "copysign", "dropout", "native_dropout",
            "alias_copy", "nan_to_num", "floor_divide", "scalar_tensor", "xlogy",
            # diff: x[i+1] - x[i] (HF GPT-2's position ids; test_capture_thirdparty)
            "diff", "__and__", "__or__", "__xor__", "__invert__",
            # the numpy-style aliases, which export leaves as they are written
            "multiply", "subtract", "divide", "true_divide", "negative", "absolute",
            "greater", "greater_equal", "less", "less_equal", "not_equal"),
           Category.POINTWISE, per_out(1), "one arithmetic op per element"),
    OpRule(("exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "tanh", "erf",
            "erfc", "sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh", "logit"),
           Category.POINTWISE, per_out(1), "one special-function op per element"),
    OpRule(("sigmoid", "hardsigmoid"), Category.POINTWISE, per_out(4), "1/(1+exp(-x))"),
    OpRule(("silu", "hardswish", "mish"), Category.POINTWISE, per_out(5), "x * sigmoid(x)"),
    OpRule(("gelu",), Category.POINTWISE, per_out(5), "0.5x(1+erf(x/sqrt2)); tanh form is 9"),
    OpRule(("softplus", "elu", "selu", "celu"), Category.POINTWISE, per_out(3), "log(1+exp(x))"),
    OpRule(("_to_copy", "to", "type_as", "float", "half", "bfloat16", "_to_dtype"),
           Category.POINTWISE, zero, "a cast moves bytes, computes nothing"),
    # --- creation ops and materialized broadcasts
    OpRule(("zeros", "ones", "full", "empty", "arange", "zeros_like", "ones_like",
            "full_like", "empty_like", "rand", "randn", "rand_like", "randn_like", "scalar_tensor",
            "new_zeros", "new_ones", "new_full", "new_empty", "triu", "tril", "linspace",
            "empty_strided", "fill"),
           Category.BROADCAST, zero, "writes its output, reads nothing (or a pattern)"),
    OpRule(("repeat", "expand_copy", "repeat_interleave", "tile"), Category.BROADCAST, zero,
           "materializes a broadcast"),
    # --- data movement that materializes
    OpRule(("clone", "cat", "concat", "stack", "index_select", "gather", "embedding",
            "index", "constant_pad_nd", "pad", "roll", "flip", "scatter", "scatter_add",
            "index_put", "index_copy", "index_add", "slice_scatter", "select_scatter", "copy",
            "masked_select", "contiguous_copy", "im2col"),
           Category.COPY, zero, "reads and writes bytes, no arithmetic"),
    OpRule(("col2im",), Category.COPY, per_in(1), "sums the overlapping patches: 1 add each"),
    # --- resampling: each output element loads a few input elements (an index remapping)
    OpRule(("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
            "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"),
           Category.COPY, zero, "one load per output element"),
    OpRule(("upsample_linear1d",), Category.COPY, per_out(3), "2 taps: 2 mul, 1 add"),
    OpRule(("upsample_bilinear2d", "_upsample_bilinear2d_aa", "grid_sampler_2d"),
           Category.COPY, per_out(7), "4 taps: 4 mul, 3 add"),
    OpRule(("upsample_trilinear3d",), Category.COPY, per_out(15), "8 taps: 8 mul, 7 add"),
    OpRule(("upsample_bicubic2d", "_upsample_bicubic2d_aa"), Category.COPY, per_out(31),
           "16 taps: 16 mul, 15 add"),
    # --- views: metadata only
    OpRule(("view", "_unsafe_view", "reshape", "transpose", "permute", "t", "unsqueeze",
            "squeeze", "expand", "slice", "select", "split", "split_with_sizes", "chunk",
            "unbind", "alias", "detach", "flatten", "unflatten", "narrow", "as_strided",
            "view_as", "expand_as", "contiguous", "movedim", "swapaxes", "lift_fresh_copy",
            "lift_fresh", "real", "view_as_real", "view_as_complex", "unfold", "meshgrid"),
           Category.VIEW, zero, "changes metadata; reshape/contiguous become COPY in capture when "
                                "the layout forces a copy"),
    # --- selection and counting: library kernels the planner does not fuse (MoE routing)
    OpRule(("sort", "argsort", "topk", "kthvalue", "median", "mode", "msort"),
           Category.OPAQUE, per_in(1), "comparisons: one per input element counted (a sort "
                                      "does about log2 n); never fused"),
    OpRule(("histc", "bincount", "searchsorted", "bucketize", "unique", "_unique2",
            "unique_consecutive", "nonzero"),
           Category.OPAQUE, per_in(1), "one count or probe per input element; never fused"),
    # --- collectives (functional collectives as export shows them)
    OpRule(("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
            "broadcast", "isend", "irecv", "batch_p2p_ops", "wait_tensor"), Category.COLLECTIVE,
           zero, "communication; never fused across"),
)
# fmt: on

_BY_OP: dict[str, OpRule] = {}
for _rule in RULES:
    for _op in _rule.ops:
        _BY_OP.setdefault(_op, _rule)

# Ops that copy when their input cannot be viewed with the new shape.
MAYBE_COPY_VIEWS = frozenset({"reshape", "contiguous", "flatten", "unflatten"})
# Casts that return their input itself when it already has the dtype (and layout) asked
# for: `x.float().type_as(x)` in an fp32 model launches nothing (`_to_copy` always copies).
MAYBE_ALIAS_CASTS = frozenset({"to", "type_as", "float", "half", "bfloat16", "double"})


def packet_of(target: str) -> str:
    """ "aten.add_.Tensor" -> "add" (in-place variants share their out-of-place rule);
    "transformers.grouped_mm_fallback.default" -> "grouped_mm_fallback"."""
    parts = target.split(".")
    custom = len(parts) == 3 and parts[2] == "default"  # a library's op: "ns.op.default"
    op = (
        parts[1]
        if len(parts) >= 2 and (parts[0] in ("aten", "prims", "_c10d_functional") or custom)
        else parts[-1]
    )
    if op.endswith("_") and not op.startswith("_") and op[:-1] in _BY_OP:
        op = op[:-1]
    return op


def lookup(target: str) -> OpRule | None:
    """The rule for an aten target, or None when the taxonomy does not know it."""
    return _BY_OP.get(packet_of(target))
