// Importers of convolution, pooling and nearest upsampling.
//
// ATen spells per-spatial-dim lists either in full or as one value for all dims; Kiln wants
// one entry per spatial dim, so the importers expand them. Pooling overloads also take
// unbatched input ([C, *spatial]); Kiln's pools want [N, C, *spatial], so a unit batch dim is
// added and dropped. Nearest upsampling has no op of its own: it is two index_selects with
// constant source indices computed here exactly as PyTorch computes them.
#include <algorithm>
#include <cmath>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

std::vector<int64_t> spatial(const NodeArgs& args, size_t pos, std::string_view name, size_t nsp,
                             const std::vector<int64_t>& fallback) {
  std::vector<int64_t> v = args.get_ints(pos, name, fallback);
  if (v.size() == 1 && nsp > 1) v.assign(nsp, v[0]);
  if (v.size() != nsp) reject("argument '", name, "' ", shape_str(v), " needs ", nsp, " values");
  return v;
}

void check_convolution(const NodeArgs& args) {
  const ImportTensor& x = args.tensor_arg(0, "input");
  const bool transposed = args.get_bool(6, "transposed", false);
  if (x.shape.size() < 3 || x.shape.size() > (transposed ? 4u : 5u))
    reject(transposed ? "transposed convolution" : "convolution", " over ", x.shape.size() < 3 ? 0 : x.shape.size() - 2,
           " spatial dims (Kiln supports ", transposed ? "1 and 2" : "1, 2 and 3", ")");
}

std::vector<ValueId> convert_convolution(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  ValueId x = cx.input(0, "input");
  const size_t nsp = size_t(cx.type(x).rank() - 2);
  std::vector<ValueId> in = {x, cx.input(1, "weight")};
  if (auto b = cx.opt_input(2, "bias")) in.push_back(*b);
  const bool transposed = args.get_bool(6, "transposed", false);
  Attrs a;
  a.set("stride", spatial(args, 3, "stride", nsp, {1}));
  a.set("padding", spatial(args, 4, "padding", nsp, {0}));
  a.set("dilation", spatial(args, 5, "dilation", nsp, {1}));
  a.set("groups", args.get_int(8, "groups", 1));
  if (transposed) a.set("output_padding", spatial(args, 7, "output_padding", nsp, {0}));
  return {cx.add(transposed ? OpKind::kConvTranspose : OpKind::kConv, in, a)};
}

// Pools over `nsp` spatial dims: runs `op` on x with a batch dim, returns it in x's layout.
ValueId pool(ImportContext& cx, OpKind op, size_t nsp, const Attrs& a) {
  ValueId x = cx.input(0, "self");
  const std::vector<int64_t> shape = cx.type(x).shape();
  if (shape.size() != nsp + 1 && shape.size() != nsp + 2)
    reject("pooling over ", nsp, " spatial dims needs a ", nsp + 1, "-D or ", nsp + 2, "-D input, got ",
           shape_str(shape));
  const bool unbatched = shape.size() == nsp + 1;
  if (unbatched) {
    std::vector<int64_t> batched = shape;
    batched.insert(batched.begin(), 1);
    x = cx.reshape(x, batched);
  }
  ValueId y = cx.add(op, {x}, a);
  if (unbatched) {
    std::vector<int64_t> s = cx.type(y).shape();
    s.erase(s.begin());
    y = cx.reshape(y, s);
  }
  return y;
}

template <size_t N>
std::vector<ValueId> convert_max_pool(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  Attrs a;
  a.set("kernel", spatial(args, 1, "kernel_size", N, {}));
  std::vector<int64_t> stride = args.get_ints(2, "stride", {});
  a.set("stride", stride.empty() ? std::vector<int64_t>{} : spatial(args, 2, "stride", N, {}));
  a.set("padding", spatial(args, 3, "padding", N, {0}));
  a.set("dilation", spatial(args, 4, "dilation", N, {1}));
  a.set("ceil_mode", args.get_bool(5, "ceil_mode", false));
  return {pool(cx, OpKind::kMaxPool, N, a)};
}

void check_max_pool_with_indices(const NodeArgs& args) { args.require_unused(1, "indices"); }

template <size_t N>
std::vector<ValueId> convert_avg_pool(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  Attrs a;
  a.set("kernel", spatial(args, 1, "kernel_size", N, {}));
  std::vector<int64_t> stride = args.get_ints(2, "stride", {});
  a.set("stride", stride.empty() ? std::vector<int64_t>{} : spatial(args, 2, "stride", N, {}));
  a.set("padding", spatial(args, 3, "padding", N, {0}));
  a.set("ceil_mode", args.get_bool(4, "ceil_mode", false));
  a.set("count_include_pad", args.get_bool(5, "count_include_pad", true));
  if (N == 2) {
    const int64_t divisor = args.get_int(6, "divisor_override", 0);
    if (divisor < 0) reject("avg_pool divisor_override ", divisor);
    a.set("divisor", divisor);
  }
  return {pool(cx, OpKind::kAvgPool, N, a)};
}

template <size_t N>
std::vector<ValueId> convert_adaptive_avg_pool(ImportContext& cx) {
  Attrs a;
  a.set("output_size", spatial(cx.args, 1, "output_size", N, {}));
  return {pool(cx, OpKind::kAdaptiveAvgPool, N, a)};
}

// PyTorch's nearest source index: floor(dst * scale) clamped to the input, with
// scale = 1 / scale_factor when one is given and in / out otherwise, in float arithmetic;
// exact doubling is dst / 2 whatever the scale.
std::vector<int64_t> nearest_indices(int64_t in, int64_t out, std::optional<double> scale_factor) {
  const float scale = scale_factor && *scale_factor > 0 ? float(1.0 / *scale_factor) : float(in) / float(out);
  std::vector<int64_t> idx(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i)
    idx[size_t(i)] = out == 2 * in ? i / 2 : std::min(int64_t(std::floor(float(i) * scale)), in - 1);
  return idx;
}

// upsample_nearest2d(self, output_size, scales_h?, scales_w?) and
// upsample_nearest2d.vec(input, output_size?, scale_factors?): the FX output fixes the sizes.
std::vector<ValueId> convert_upsample_nearest2d(ImportContext& cx, bool vec) {
  const NodeArgs& args = cx.args;
  ValueId x = cx.input(0, vec ? "input" : "self");
  const std::vector<int64_t> in = cx.type(x).shape(), out = args.out().shape;
  if (in.size() != 4 || out.size() != 4) reject("upsample_nearest2d needs a 4-D input, got ", shape_str(in));
  std::optional<double> scales[2];
  if (vec) {
    const ImportArg* sf = args.find(2, "scale_factors");
    if (sf && sf->kind == ImportArg::Kind::kList && sf->list.size() == 2) {
      for (size_t i = 0; i < 2; ++i) {
        const ImportArg& e = sf->list[i];
        scales[i] = e.kind == ImportArg::Kind::kFloat ? e.f : double(e.i);
      }
    }
  } else {
    if (args.given(2, "scales_h")) scales[0] = args.get_float(2, "scales_h");
    if (args.given(3, "scales_w")) scales[1] = args.get_float(3, "scales_w");
  }
  for (size_t i = 0; i < 2; ++i) {
    const int64_t axis = int64_t(2 + i);
    if (in[size_t(axis)] == out[size_t(axis)]) continue;  // PyTorch copies, whatever the scale
    if (in[size_t(axis)] == 0) reject("upsample_nearest2d of an empty input");
    Attrs a;
    a.set("axis", axis);
    ValueId idx = cx.index_constant(nearest_indices(in[size_t(axis)], out[size_t(axis)], scales[i]));
    x = cx.add(OpKind::kIndexSelect, {x, idx}, a);
  }
  return {x};
}

std::vector<ValueId> convert_upsample(ImportContext& cx) { return convert_upsample_nearest2d(cx, false); }
std::vector<ValueId> convert_upsample_vec(ImportContext& cx) { return convert_upsample_nearest2d(cx, true); }

}  // namespace

std::vector<ImportEntry> conv_importers() {
  return {
      {"aten.convolution.default", &check_convolution, &convert_convolution},
      {"aten.max_pool2d_with_indices.default", &check_max_pool_with_indices, &convert_max_pool<2>},
      {"aten.max_pool2d.default", nullptr, &convert_max_pool<2>},
      {"aten.max_pool1d.default", nullptr, &convert_max_pool<1>},
      {"aten.avg_pool2d.default", nullptr, &convert_avg_pool<2>},
      {"aten.avg_pool1d.default", nullptr, &convert_avg_pool<1>},
      {"aten._adaptive_avg_pool2d.default", nullptr, &convert_adaptive_avg_pool<2>},
      {"aten.adaptive_avg_pool2d.default", nullptr, &convert_adaptive_avg_pool<2>},
      {"aten.adaptive_avg_pool1d.default", nullptr, &convert_adaptive_avg_pool<1>},
      {"aten.upsample_nearest2d.default", nullptr, &convert_upsample},
      {"aten.upsample_nearest2d.vec", nullptr, &convert_upsample_vec},
  };
}

}  // namespace kiln::aten
