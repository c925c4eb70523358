// Shape rules of the conv family: conv over 1, 2 or 3 spatial dims and conv_transpose over 1
// or 2, with PyTorch's attributes, defaults and output-size formulas.
//
//   conv:           out = floor((in + 2p - d(k-1) - 1) / s) + 1
//   conv_transpose: out = (in - 1)s - 2p + d(k-1) + output_padding + 1
//
// conv also carries the fused epilogue of src/ops/epilogue.h: an optional residual input of
// the output's type and an `activation` attribute, act(conv(x, w) + bias + residual);
// conv_transpose has neither.
//
// Missing attributes take PyTorch's defaults (stride 1, padding 0, dilation 1, groups 1,
// output_padding 0). Lists must have one entry per spatial dim: importers expand scalars.
//
// layout = "nhwc" (conv over 2 spatial dims only; set by the to_channels_last pass) puts the
// channels last in every tensor: x [N, H, W, C], weight [O, KH, KW, C/groups], residual and
// output [N, OH, OW, O]. The rule checks the channels-first view of each and gives the output
// channels last. Without it (or with "nchw") tensors are channels-first as in PyTorch.
#include <algorithm>
#include <string>
#include <variant>

#include "src/ops/checked.h"
#include "src/ops/epilogue.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

int64_t int_attr(OpKind op, const Attrs& a, const char* key, int64_t fallback) {
  if (!a.has(key)) return fallback;
  const AttrValue& v = a.items().at(key);
  KILN_CHECK(std::holds_alternative<int64_t>(v), kInvalidArgument, op_name(op), ": attribute '", key,
             "' must be an int");
  return std::get<int64_t>(v);
}

std::vector<TensorType> infer_conv_channels_first(OpKind op, const TypeList& in, const Attrs& a);

}  // namespace

std::vector<TensorType> infer_conv(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kConv || op == OpKind::kConvTranspose, kInternal, op_name(op),
             " is not in the conv family");
  if (!channels_last(op, a)) return infer_conv_channels_first(op, in, a);
  std::vector<TensorType> first;  // x, w, bias, residual seen channels-first
  TypeList view;
  for (size_t i = 0; i < in.size(); ++i) {
    KILN_CHECK(!in[i] || i == 2 || in[i]->rank() == 4, kShapeMismatch, op_name(op), ": layout \"nhwc\" takes ",
               i == 0 ? "x" : i == 1 ? "weight" : "residual", " of rank 4 ([N, H, W, C]), got ", in[i]->to_string());
    first.push_back(in[i] && i != 2 ? channels_first_view(*in[i]) : in[i] ? *in[i] : TensorType{});
  }
  for (size_t i = 0; i < in.size(); ++i) view.push_back(in[i] ? &first[i] : nullptr);
  std::vector<TensorType> out = infer_conv_channels_first(op, view, a);
  out[0] = channels_last_view(out[0]);
  return out;
}

namespace {

std::vector<TensorType> infer_conv_channels_first(OpKind op, const TypeList& in, const Attrs& a) {
  const bool transpose = op == OpKind::kConvTranspose;
  const char* name = op_name(op);
  const TensorType& x = *in[0];
  const TensorType& w = *in[1];
  const TensorType* bias = in.size() > 2 ? in[2] : nullptr;
  const TensorType* residual = in.size() > 3 ? in[3] : nullptr;
  if (transpose)
    KILN_CHECK(!a.has("activation"), kInvalidArgument, name, ": attribute 'activation' applies to conv only");
  else
    pw::parse_activation(op, a);

  KILN_CHECK(is_floating(x.dtype), kInvalidArgument, name, ": x must be floating, got ", x.to_string());
  KILN_CHECK(w.dtype == x.dtype, kInvalidArgument, name, ": weight ", w.to_string(), " must have the dtype of x ",
             x.to_string());
  KILN_CHECK(x.rank() == 3 || x.rank() == 4 || (x.rank() == 5 && !transpose), kShapeMismatch, name,
             ": x must be [N, C, *spatial] with ", transpose ? "1 or 2" : "1, 2 or 3", " spatial dims, got ",
             x.to_string());
  KILN_CHECK(w.rank() == x.rank(), kShapeMismatch, name, ": weight ", w.to_string(), " must have the rank of x ",
             x.to_string());
  const size_t nsp = size_t(x.rank() - 2);

  int64_t groups = int_attr(op, a, "groups", 1);
  KILN_CHECK(groups >= 1, kInvalidArgument, name, ": groups must be >= 1, got ", groups);
  auto stride = spatial_attr(op, a, "stride", nsp, std::vector<int64_t>(nsp, 1), 1);
  auto padding = spatial_attr(op, a, "padding", nsp, std::vector<int64_t>(nsp, 0), 0);
  auto dilation = spatial_attr(op, a, "dilation", nsp, std::vector<int64_t>(nsp, 1), 1);
  std::vector<int64_t> out_pad(nsp, 0);
  if (transpose) {
    out_pad = spatial_attr(op, a, "output_padding", nsp, std::vector<int64_t>(nsp, 0), 0);
  } else if (a.has("output_padding")) {  // tolerated as all zeros (aten.convolution carries one)
    auto op_list = spatial_attr(op, a, "output_padding", nsp, std::vector<int64_t>(nsp, 0), 0);
    KILN_CHECK(std::all_of(op_list.begin(), op_list.end(), [](int64_t v) { return v == 0; }), kInvalidArgument, name,
               ": output_padding ", list_str(op_list), " applies to conv_transpose only");
  }

  const int64_t c = x.dims[1].extent;
  KILN_CHECK(c % groups == 0, kShapeMismatch, name, ": input channels ", c, " of x ", x.to_string(),
             " are not divisible by groups ", groups);
  int64_t out_channels;
  Dim out_c_dim;
  if (!transpose) {
    out_channels = w.dims[0].extent;
    out_c_dim = w.dims[0];
    KILN_CHECK(out_channels % groups == 0, kShapeMismatch, name, ": output channels ", out_channels, " of weight ",
               w.to_string(), " are not divisible by groups ", groups);
    const int64_t expects = Checked(op, "the weight's input channels times groups").mul(w.dims[1].extent, groups);
    KILN_CHECK(expects == c, kShapeMismatch, name, ": weight ", w.to_string(), " expects ", expects,
               " input channels (", w.dims[1].extent, " per group x ", groups, " groups), x ", x.to_string(), " has ",
               c);
  } else {
    KILN_CHECK(w.dims[0].extent == c, kShapeMismatch, name, ": weight ", w.to_string(),
               " must be [C_in, C_out/groups, *kernel] with C_in = ", c, " from x ", x.to_string());
    out_channels = Checked(op, "the output channels (weight dim 1 times groups)").mul(w.dims[1].extent, groups);
    out_c_dim.extent = out_channels;
  }
  KILN_CHECK(out_channels >= 1, kShapeMismatch, name, ": weight ", w.to_string(), " gives no output channels");
  if (bias) {
    KILN_CHECK(bias->dtype == x.dtype, kInvalidArgument, name, ": bias ", bias->to_string(),
               " must have the dtype of x ", x.to_string());
    KILN_CHECK(bias->rank() == 1 && bias->dims[0].extent == out_channels, kShapeMismatch, name, ": bias must be [",
               out_channels, "], got ", bias->to_string());
  }

  TensorType out;
  out.dtype = x.dtype;
  out.dims.push_back(x.dims[0]);
  out.dims.push_back(out_c_dim);
  for (size_t i = 0; i < nsp; ++i) {
    const int64_t in_size = x.dims[2 + i].extent, k = w.dims[2 + i].extent;
    KILN_CHECK(k >= 1, kShapeMismatch, name, ": weight ", w.to_string(), " has an empty kernel");
    const Checked ck(op, "the output size from stride, padding and dilation");
    const int64_t eff = ck.add(ck.mul(dilation[i], k - 1), 1);  // the kernel's extent with dilation
    int64_t o;
    if (!transpose) {
      const int64_t padded = ck.add(in_size, ck.mul(2, padding[i]));
      KILN_CHECK(padded >= eff, kShapeMismatch, name, ": spatial dim ", i, " of x ", x.to_string(), " is ", in_size,
                 " (", padded, " padded), smaller than the kernel's ", eff, " (dilated)");
      o = (padded - eff) / stride[i] + 1;
    } else {
      KILN_CHECK(out_pad[i] < stride[i] || out_pad[i] < dilation[i], kInvalidArgument, name, ": output_padding ",
                 list_str(out_pad), " must be smaller than stride ", list_str(stride), " or dilation ",
                 list_str(dilation));
      o = ck.add(ck.add(ck.sub(ck.mul(in_size - 1, stride[i]), ck.mul(2, padding[i])), eff), out_pad[i]);
      KILN_CHECK(in_size >= 1 && o >= 1, kShapeMismatch, name, ": spatial dim ", i, " of x ", x.to_string(),
                 " gives output size ", o, " (stride ", stride[i], ", padding ", padding[i], ")");
    }
    Dim d;
    d.extent = o;
    out.dims.push_back(d);
  }
  if (residual) {
    KILN_CHECK(residual->dtype == x.dtype, kInvalidArgument, name, ": residual ", residual->to_string(),
               " must have the dtype of x ", x.to_string());
    KILN_CHECK(residual->shape() == out.shape(), kShapeMismatch, name, ": residual ", residual->to_string(),
               " must have the output's shape ", out.to_string());
  }
  return {out};
}

}  // namespace
}  // namespace kiln
