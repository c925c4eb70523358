// Building the cuDNN operation graph of a conv node (conv_graph.h) and the source of the
// generated epilogue that replaces the graph's pointwise tail when cuDNN cannot fuse it.
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels/conv_graph.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda {

namespace {

std::string ints_str(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// A conv's dims as cuDNN takes them: [a, b, h, w] (a 1-D conv has height 1), or [a, b, d, h, w]
// over 3 spatial dims; and its per-spatial-dim attributes likewise.
std::vector<int64_t> outer_spatial(const ConvGeom& q, int64_t a, int64_t b, int64_t d, int64_t h, int64_t w) {
  return q.three_d ? std::vector<int64_t>{a, b, d, h, w} : std::vector<int64_t>{a, b, h, w};
}
std::vector<int64_t> spatial(const ConvGeom& q, int64_t d, int64_t h, int64_t w) {
  return q.three_d ? std::vector<int64_t>{d, h, w} : std::vector<int64_t>{h, w};
}

// [N, C, H, W] (or [N, C, D, H, W]) with NCHW or channels-last strides (also used for weights).
std::vector<int64_t> strides_of(const std::vector<int64_t>& d, bool channels_last) {
  if (channels_last) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};  // 4-D only (to_channels_last)
  std::vector<int64_t> s(d.size(), 1);
  for (size_t i = d.size() - 1; i-- > 0;) s[i] = s[i + 1] * d[i + 1];
  return s;
}

Desc tensor(int64_t uid, cudnnDataType_t dt, const std::vector<int64_t>& dims, bool channels_last, bool is_virtual,
            const std::string& what) {
  return tensor_desc(uid, dt, dims, strides_of(dims, channels_last), is_virtual, what);
}

cudnnPointwiseMode_t act_mode(const pw::Activation& a) {
  switch (a.op) {
    case OpKind::kRelu:
    case OpKind::kClamp: return CUDNN_POINTWISE_RELU_FWD;  // clipped_relu: with its upper clip
    case OpKind::kGelu: return a.params.gelu_tanh ? CUDNN_POINTWISE_GELU_APPROX_TANH_FWD : CUDNN_POINTWISE_GELU_FWD;
    case OpKind::kSilu: return CUDNN_POINTWISE_SWISH_FWD;
    case OpKind::kSigmoid: return CUDNN_POINTWISE_SIGMOID_FWD;
    case OpKind::kTanh: return CUDNN_POINTWISE_TANH_FWD;
    default: KILN_FAIL(kUnsupported, "cuDNN conv: activation '", a.name, "'");
  }
}

// cuDNN has no hardswish / hardsigmoid mode: they are chains of its pointwise ops,
// hardsigmoid(v) = min(max(v + 3, 0), 6) * (1/6) and hardswish(v) = v * hardsigmoid(v).
int activation_ops(const pw::Activation& a) {
  if (a.none) return 0;
  if (!hard_activation(a)) return 1;
  return a.op == OpKind::kHardswish ? 4 : 3;
}

// The by-value scalars of those chains (host values cuDNN copies into each launch).
const float kThree = 3.0f, kSixth = 1.0f / 6.0f;

}  // namespace

bool hard_activation(const pw::Activation& a) {
  return !a.none && (a.op == OpKind::kHardswish || a.op == OpKind::kHardsigmoid);
}

namespace {

// What conv_geometry refuses: a node of the conv family whose shape or attributes cuDNN cannot take
// (without the node's name: a partition report lists one reason for every such node).
std::string shape_refusal(const Node& n, const Graph& g) {
  const TensorType& x = g.type(n.inputs[0]);
  if (x.rank() < 3 || x.rank() > 5)
    return detail::concat(op_name(n.op), " over ", x.rank() - 2, " spatial dims (1, 2 or 3 on CUDA)");
  if (n.op == OpKind::kConvTranspose) {
    const size_t nsp = size_t(x.rank() - 2);
    const auto stride = n.attrs.get_ints("stride", std::vector<int64_t>(nsp, 1));
    const auto op = n.attrs.get_ints("output_padding", std::vector<int64_t>(nsp, 0));
    for (size_t i = 0; i < nsp && i < op.size() && i < stride.size(); ++i)
      if (op[i] >= stride[i])
        return detail::concat("conv_transpose output_padding ", ints_str(op), " must be smaller than stride ",
                              ints_str(stride), " on CUDA (cuDNN backward data)");
  }
  return {};
}

}  // namespace

std::string conv_refusal(const Node& n, const Graph& g) {
  if (n.op != OpKind::kConv && n.op != OpKind::kConvTranspose)
    return detail::concat(op_name(n.op), " is not in the conv family");
  if (std::string refusal = shape_refusal(n, g); !refusal.empty()) return refusal;
  const TensorType& x = g.type(n.inputs[0]);
  if (x.dtype != DType::kF32 && x.dtype != DType::kF16 && x.dtype != DType::kBF16)
    return detail::concat(op_name(n.op), " on CUDA runs f32, f16 and bf16, got ", dtype_name(x.dtype));
  return {};
}

ConvGeom conv_geometry(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kConv || n.op == OpKind::kConvTranspose, kInternal, op_name(n.op),
             " is not in the conv family");
  const std::string refusal = shape_refusal(n, g);
  KILN_CHECK(refusal.empty(), kUnsupported, refusal);
  ConvGeom q;
  q.transpose = n.op == OpKind::kConvTranspose;
  const auto x = g.type(n.inputs[0]).shape(), w = g.type(n.inputs[1]).shape();
  const auto y = g.type(n.outputs[0]).shape();
  q.dtype = g.type(n.inputs[0]).dtype;
  const size_t nsp = x.size() - 2;
  q.one_d = nsp == 1;
  const Attrs& a = n.attrs;
  q.nhwc = channels_last(n.op, a);
  const auto stride = a.get_ints("stride", std::vector<int64_t>(nsp, 1));
  const auto pad = a.get_ints("padding", std::vector<int64_t>(nsp, 0));
  const auto dil = a.get_ints("dilation", std::vector<int64_t>(nsp, 1));
  const bool two = nsp >= 2;
  q.three_d = nsp == 3;
  if (q.three_d) {  // x [N, C, D, H, W], w [O, C/g, KD, KH, KW], y [N, O, OD, OH, OW]
    q.D = x[2], q.OD = y[2], q.KD = w[2];
    q.sd = stride[0], q.pd = pad[0], q.dd = dil[0];
  }
  if (q.nhwc) {  // x [N, H, W, C], w [O, KH, KW, C/g], y [N, OH, OW, O] (the shape rule checked rank 4)
    q.N = x[0], q.C = x[3], q.H = x[1], q.W = x[2];
    q.O = y[3], q.OH = y[1], q.OW = y[2];
    q.W0 = w[0], q.W1 = w[3], q.KH = w[1], q.KW = w[2];
  } else {
    const size_t h = nsp - 2;  // the height's position among the spatial dims
    q.N = x[0], q.C = x[1], q.H = two ? x[2 + h] : 1, q.W = x.back();
    q.O = y[1], q.OH = two ? y[2 + h] : 1, q.OW = y.back();
    q.W0 = w[0], q.W1 = w[1], q.KH = two ? w[2 + h] : 1, q.KW = w.back();
  }
  const size_t h = nsp >= 2 ? nsp - 2 : 0;
  q.sh = two ? stride[h] : 1, q.sw = stride.back();
  q.ph = two ? pad[h] : 0, q.pw = pad.back();
  q.dh = two ? dil[h] : 1, q.dw = dil.back();
  q.groups = a.get_int("groups", 1);
  q.bias = n.inputs.size() > 2 && n.inputs[2] != kNoValue;
  q.residual = n.inputs.size() > 3 && n.inputs[3] != kNoValue;
  q.act = pw::parse_activation(n.op, a);
  return q;
}

std::vector<std::string> conv_key_parts(const ConvGeom& q) {
  const std::string s = ints_str(spatial(q, q.sd, q.sh, q.sw)), p = ints_str(spatial(q, q.pd, q.ph, q.pw)),
                    d = ints_str(spatial(q, q.dd, q.dh, q.dw));
  return {q.three_d     ? "conv3d"
          : q.transpose ? "conv_transpose"
                        : "conv",
          dtype_name(q.dtype),
          std::string("x=") + ints_str(outer_spatial(q, q.N, q.C, q.D, q.H, q.W)),
          std::string("w=") + ints_str(outer_spatial(q, q.W0, q.W1, q.KD, q.KH, q.KW)),
          std::string("y=") + ints_str(outer_spatial(q, q.N, q.O, q.OD, q.OH, q.OW)),
          "s=" + s + " p=" + p + " d=" + d + " g=" + std::to_string(q.groups),
          std::string(q.bias ? "bias" : "nobias") + (q.residual ? " residual" : "") + " act=" + q.act.name +
              (q.act.op == OpKind::kClamp ? "<=" + float_literal(q.act.params.hi, DType::kF64) : ""),
          q.three_d ? "ncdhw"
          : q.nhwc  ? "nhwc"
                    : "nchw"};
}

ConvOpGraph build_conv_graph(const ConvGeom& q, cudnnHandle_t handle, bool fused, const std::string& what) {
  ConvOpGraph og;
  const cudnnDataType_t dt = cudnn_dtype(q.dtype);
  const bool cl = q.nhwc;
  const std::vector<int64_t> xd = outer_spatial(q, q.N, q.C, q.D, q.H, q.W),
                             wd = outer_spatial(q, q.W0, q.W1, q.KD, q.KH, q.KW),
                             yd = outer_spatial(q, q.N, q.O, q.OD, q.OH, q.OW);
  const bool epi = fused && q.has_epilogue();
  auto keep = [&](Desc d) -> const Desc& {
    og.parts.push_back(std::move(d));
    return og.parts.back();
  };
  const Desc& x = keep(tensor(kUidX, dt, xd, cl, false, what + ": tensor x"));
  const Desc& w = keep(tensor(kUidW, dt, wd, cl, false, what + ": tensor w"));
  const Desc& y = keep(tensor(kUidY, dt, yd, cl, false, what + ": tensor y"));
  int64_t next_virtual = 100;
  auto virt = [&]() -> const Desc& {
    return keep(tensor(next_virtual++, CUDNN_DATA_FLOAT, yd, cl, true, what + ": intermediate"));
  };
  const Desc* acc = epi ? &virt() : &y;

  Desc& conv = og.parts.emplace_back(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what + ": convolution");
  const int64_t spatial_dims = q.three_d ? 3 : 2;
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::vector<int64_t> pads = spatial(q, q.pd, q.ph, q.pw);
  conv.set_i64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, spatial_dims)
      .set_dtype(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, comp)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set_i64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, spatial(q, q.dd, q.dh, q.dw))
      .set_i64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, spatial(q, q.sd, q.sh, q.sw))
      .set_i64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, pads)
      .set_i64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, pads)
      .finalize();

  const float alpha = 1.0f, beta = 0.0f;
  std::vector<const Desc*> ops;
  if (!q.transpose) {
    Desc& op = og.parts.emplace_back(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, what + ": conv forward");
    op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *acc)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta)
        .finalize();
    ops.push_back(&op);
  } else {
    Desc& op = og.parts.emplace_back(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                     what + ": conv backward data");
    op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, *acc)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta)
        .finalize();
    ops.push_back(&op);
  }
  og.ops = q.transpose ? "conv_transpose" : "conv";
  og.uids = {kUidX, kUidW};

  if (epi) {
    int remaining = int(q.bias) + int(q.residual) + activation_ops(q.act);
    // One pointwise node: out = mode(in, operand); the last one writes y. `clip`: RELU_FWD's
    // upper clip (none when <= 0).
    auto pointwise = [&](cudnnPointwiseMode_t pm, const Desc* in, const Desc* operand, const char* name,
                         double clip = 0) {
      const Desc* out = --remaining == 0 ? &y : &virt();
      ops.push_back(&pointwise_op(og.parts, pm, *in, operand, *out, what + ": " + name, clip));
      return out;
    };
    if (q.bias) {
      std::vector<int64_t> bd(yd.size(), 1);
      bd[1] = q.O;
      const Desc& b = keep(tensor(kUidBias, dt, bd, cl, false, what + ": tensor bias"));
      og.uids.push_back(kUidBias);
      acc = pointwise(CUDNN_POINTWISE_ADD, acc, &b, "bias");
      og.ops += " + bias";
    }
    if (q.residual) {
      const Desc& r = keep(tensor(kUidResidual, dt, yd, cl, false, what + ": tensor residual"));
      og.uids.push_back(kUidResidual);
      acc = pointwise(CUDNN_POINTWISE_ADD, acc, &r, "residual");
      og.ops += " + residual";
    }
    if (hard_activation(q.act)) {
      auto scalar = [&](int64_t uid, const char* name) -> const Desc& {
        og.uids.push_back(uid);
        return keep(scalar_desc(uid, what + ": scalar " + name));
      };
      const Desc* v = acc;
      const Desc* t = pointwise(CUDNN_POINTWISE_ADD, v, &scalar(kUidThree, "3"), "+3");
      t = pointwise(CUDNN_POINTWISE_RELU_FWD, t, nullptr, "clip 0..6", 6.0);
      t = pointwise(CUDNN_POINTWISE_MUL, t, &scalar(kUidSixth, "1/6"), "/6");
      if (q.act.op == OpKind::kHardswish) t = pointwise(CUDNN_POINTWISE_MUL, t, v, "*v");
      acc = t;
      og.ops += " + " + q.act.name;
    } else if (!q.act.none) {
      acc = pointwise(act_mode(q.act), acc, nullptr, q.act.name.c_str(),
                      q.act.op == OpKind::kClamp ? q.act.params.hi : 0.0);
      og.ops += " + " + q.act.name;
    }
  }
  og.uids.push_back(kUidY);

  og.graph = Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what + ": operation graph (" + og.ops + ")");
  og.graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set_descs(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)
      .finalize();
  return og;
}

void* conv_data_ptr(int64_t uid, void* x, void* w, void* bias, void* residual, void* y) {
  switch (uid) {
    case kUidX: return x;
    case kUidW: return w;
    case kUidBias: return bias;
    case kUidResidual: return residual;
    case kUidY: return y;
    case kUidThree: return const_cast<float*>(&kThree);
    case kUidSixth: return const_cast<float*>(&kSixth);
    default: KILN_FAIL(kInternal, "conv: no tensor has uid ", uid);
  }
}

std::string conv_epilogue_source(const ConvGeom& q) {
  const std::string act = activation_call(q.act, "v");
  const std::string t = storage_type(q.dtype);
  return prelude() + "\ntypedef " + t + " T;\n" +
         "__device__ __forceinline__ float kc_epi(float v, const T* bias, long long c, const T* residual, long long i) "
         "{\n"
         "  if (bias) v += to_float(bias[c]);\n"
         "  if (residual) v += to_float(residual[i]);\n"
         "  return " +
         act +
         ";\n"
         "}\n"
         "extern \"C\" __global__ void kiln_conv_epilogue(T* y, const T* bias, const T* residual, long long n,\n"
         "                                               long long inner, long long channels) {\n"
         "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
         "       i += (long long)gridDim.x * blockDim.x)\n"
         "    y[i] = from_float<T>(kc_epi(to_float(y[i]), bias, (i / inner) % channels, residual, i));\n"
         "}\n"
         "// Channels-last, channels a multiple of the vector: 16 bytes of one pixel's channels a step.\n"
         "extern \"C\" __global__ void kiln_conv_epilogue_vec(T* y, const T* bias, const T* residual, long long nvec,\n"
         "                                                   long long channels) {\n"
         "  const int V = 16 / sizeof(T);\n"
         "  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < nvec;\n"
         "       k += (long long)gridDim.x * blockDim.x) {\n"
         "    uint4 u = reinterpret_cast<uint4*>(y)[k];\n"
         "    T* e = reinterpret_cast<T*>(&u);\n"
         "    const long long i = k * V, c = i % channels;\n"
         "#pragma unroll\n"
         "    for (int j = 0; j < V; ++j) e[j] = from_float<T>(kc_epi(to_float(e[j]), bias, c + j, residual, i + j));\n"
         "    reinterpret_cast<uint4*>(y)[k] = u;\n"
         "  }\n"
         "}\n";
}

}  // namespace kiln::cuda
