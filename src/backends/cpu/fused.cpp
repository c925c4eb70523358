// CPU kernel of fused_pointwise: runs the node's body (a graph of unary / binary / where / cast
// ops, every op output of a shape that broadcasts to the group shape) block by block, so every
// intermediate stays in a cache-sized scratch block instead of a full tensor. Every value is
// computed at the group shape: an op of a smaller shape (a per-channel gate recomputed for every
// element it scales) reads its leaves broadcast like any other op.
//
// The factory compiles the body into steps over value references:
//   - a leaf (body input or constant) that already holds the compute type and the group shape,
//     or is a single element, is read in place (stride 1, or 0 for one element); constants are
//     converted to the compute type at build time (the fusion pass only copies small, non-weight
//     constants into bodies);
//   - any other leaf (another dtype, or a shape that broadcasts, like a [C] bias against
//     [N, C]) is loaded into a scratch slot per block, through a pw::BroadcastPlan;
//   - every op writes its own scratch slot, computed with the same pw:: array loops as the
//     unfused kernels, so a fused f32 chain equals the unfused one bit for bit.
// The compute type is f32, or f64 when any body value is f64, i64 or i32 (integers stay exact
// up to 2^53). Values of integer dtype keep integer semantics: div truncates (x / 0 == 0),
// results wrap to their dtype, clamp bounds round inward; an f32 value in an f64 program is
// rounded to f32 after its op, so that an f32 chain ending in a cast to an integer (T5's
// relative position buckets) truncates what the f32 chain computes. Casts round as cast does
// (to f16, bf16, f32, integers, bool); other intermediates are not rounded to a 16-bit dtype,
// as in other fusing compilers. Blocks split over threads, each part with its own scratch slots.
// An index_select in the body (a gathered leaf: its data and index are node inputs) loads its
// block from the data at the indexed positions. An input the node reads through a view
// ("view<i>": a permute, slice or expand of it) is loaded through the view's strides, and a
// gather's data through the view's map from its logical elements to the buffer's.
// A single-output kernel may have its output written over an input of the same type (the
// memory planner's in-place rule): a block stores only after every read of its elements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

#include "src/backends/cpu/kernels.h"
#include "src/ops/access.h"
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kBlock = 1024;
constexpr int64_t kSerialBelow = 32768;  // elements under which one thread runs everything

template <typename T>
constexpr DType compute_dtype() {
  return std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
}

template <typename T>
void load_run(const void* p, DType dt, int64_t off, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    to_f32(static_cast<const uint8_t*>(p) + off * int64_t(dtype_size(dt)), dt, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_as_double(p, dt, off + i);
  }
}

template <typename T>
struct Program {
  // Where a body value's block lives: a scratch slot, a node input read in place, or a
  // converted constant. `scalar`: one element for the whole group (stride 0).
  struct Ref {
    int slot = -1, input = -1;
    std::shared_ptr<const std::vector<T>> constant;
    bool scalar = false;
  };
  // A leaf loaded into a slot each block, from element `offset` on.
  struct Load {
    int slot, input;  // input < 0: from `constant`
    std::shared_ptr<const std::vector<T>> constant;
    DType dtype;
    bool scalar;
    pw::BroadcastPlan plan;
    int64_t offset = 0;
  };
  // A gathered leaf (index_select of a node input by a node input) loaded into a slot each
  // block: element e of the virtual [outer, count, inner] result is data element
  // (outer * dim + index[a]) * inner + (e % inner), a = (e / inner) % count.
  struct Gather {
    int slot, data, index;
    DType dtype, index_dtype;
    int64_t count, inner, dim;
    pw::BroadcastPlan plan;  // the result's shape against the group
    std::optional<OperandView> view;  // how the data is read, when not whole and row-major
    std::vector<int64_t> view_sizes;  // the view's logical sizes (read per element)
  };
  struct Step {
    OpKind op;
    pw::UnaryParams params;
    DType out_dtype;
    std::vector<int> in;  // value indices
    int out;              // value index (a slot)
  };

  std::vector<Ref> vals;
  std::vector<Load> loads;
  std::vector<Gather> gathers;
  std::vector<Step> steps;
  std::vector<std::pair<int, DType>> outputs;  // value index, node output dtype
  int slots = 0;
  int64_t numel = 0;

  const T* ptr(int v, const void* const* in, T* scratch, int64_t start) const {
    const Ref& r = vals[size_t(v)];
    const int64_t off = r.scalar ? 0 : start;
    if (r.slot >= 0) return scratch + int64_t(r.slot) * kBlock;
    if (r.input >= 0) return static_cast<const T*>(in[r.input]) + off;
    return r.constant->data() + off;
  }
  int64_t stride(int v) const { return vals[size_t(v)].scalar ? 0 : 1; }

  void run_block(const void* const* in, void* const* out, T* scratch, int64_t start, int64_t len) const;
  void gather(const Gather& q, const void* const* in, T* dst, int64_t start, int64_t len) const;
  // Raises index_select's error for an index out of [-dim, dim).
  void check_indices(const void* const* in) const;
};

int64_t index_at(const void* p, DType t, int64_t i) {
  return t == DType::kI64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

template <typename T>
void Program<T>::check_indices(const void* const* in) const {
  for (const Gather& q : gathers)
    for (int64_t a = 0; a < q.count; ++a) {
      const int64_t v = index_at(in[q.index], q.index_dtype, a);
      KILN_CHECK(v >= -q.dim && v < q.dim, kInvalidArgument, "fused_pointwise: index_select index ", v,
                 " is out of range for a dim of size ", q.dim);
    }
}

template <typename T>
void Program<T>::gather(const Gather& q, const void* const* in, T* dst, int64_t start, int64_t len) const {
  q.plan.for_each_run(start, start + len, [&](const int64_t* off, int64_t o, int64_t n) {
    const bool along = q.plan.inner_stride(0) != 0;
    for (int64_t e = 0; e < n;) {
      const int64_t at = off[0] + (along ? e : 0);
      const int64_t block = at / q.inner, within = at - block * q.inner;
      int64_t v = index_at(in[q.index], q.index_dtype, block % q.count);
      if (v < 0) v += q.dim;
      // Elements left in this inner block are consecutive in the data too.
      const int64_t run = along ? std::min(n - e, q.inner - within) : 1;
      const int64_t src = ((block / q.count) * q.dim + v) * q.inner + within;
      if (q.view) {  // element by element through the view
        T x;
        load_run(in[q.data], q.dtype, q.view->offset + strided_offset(src, q.view_sizes, q.view->strides), &x, 1);
        std::fill(dst + (o - start) + e, dst + (o - start) + e + (along ? 1 : n - e), x);
        if (!along) break;
        ++e;
        continue;
      }
      if (along) {
        load_run(in[q.data], q.dtype, src, dst + (o - start) + e, run);
      } else {
        T x;
        load_run(in[q.data], q.dtype, src, &x, 1);
        std::fill(dst + (o - start), dst + (o - start) + n, x);
        break;
      }
      e += run;
    }
  });
}

template <typename T>
void Program<T>::run_block(const void* const* in, void* const* out, T* scratch, int64_t start, int64_t len) const {
  for (const Load& l : loads) {
    T* dst = scratch + int64_t(l.slot) * kBlock;
    const void* src = l.input >= 0 ? in[l.input] : l.constant->data();
    const DType dt = l.input >= 0 ? l.dtype : compute_dtype<T>();
    if (l.scalar) {
      load_run(src, dt, l.offset, dst, 1);
      continue;
    }
    l.plan.for_each_run(start, start + len, [&](const int64_t* off, int64_t o, int64_t n) {
      const int64_t at = l.offset + off[0], step = l.plan.inner_stride(0);
      if (step == 1) {
        load_run(src, dt, at, dst + (o - start), n);
      } else if (step == 0) {
        T v;
        load_run(src, dt, at, &v, 1);
        std::fill(dst + (o - start), dst + (o - start + n), v);
      } else {  // a view whose innermost dim is strided
        for (int64_t i = 0; i < n; ++i) load_run(src, dt, at + i * step, dst + (o - start) + i, 1);
      }
    });
  }
  for (const Gather& q : gathers) gather(q, in, scratch + int64_t(q.slot) * kBlock, start, len);
  uint8_t flags[kBlock];
  for (const Step& s : steps) {
    T* y = scratch + int64_t(vals[size_t(s.out)].slot) * kBlock;
    const T* a = ptr(s.in[0], in, scratch, start);
    const int64_t sa = stride(s.in[0]);
    const OpFamily fam = op_info(s.op).family;
    if (fam == OpFamily::kUnary || s.op == OpKind::kCopy || fam == OpFamily::kCast) {
      const int64_t m = sa ? len : 1;  // a one-element input: compute once, then fill
      if (fam == OpFamily::kUnary) {
        pw::unary_array(s.op, s.params, a, y, m);
      } else if (s.op == OpKind::kCopy || s.out_dtype == compute_dtype<T>()) {
        std::memmove(y, a, size_t(m) * sizeof(T));
      } else if (s.out_dtype == DType::kF32) {
        for (int64_t i = 0; i < m; ++i) y[i] = static_cast<T>(static_cast<float>(a[i]));
      } else if (s.out_dtype == DType::kF16) {
        for (int64_t i = 0; i < m; ++i) y[i] = half_to_float(float_to_half(static_cast<float>(a[i])));
      } else if (s.out_dtype == DType::kBF16) {
        for (int64_t i = 0; i < m; ++i) y[i] = bf16_to_float(float_to_bf16(static_cast<float>(a[i])));
      } else {
        for (int64_t i = 0; i < m; ++i) y[i] = static_cast<T>(pw::cast_value(double(a[i]), s.out_dtype));
      }
      if (m < len) std::fill(y + 1, y + len, y[0]);
    } else if (fam == OpFamily::kWhere) {
      const T* b = ptr(s.in[1], in, scratch, start);
      const T* c = ptr(s.in[2], in, scratch, start);
      const int64_t sb = stride(s.in[1]), sc = stride(s.in[2]);
      for (int64_t i = 0; i < len; ++i) y[i] = pw::where_value(a[i * sa] != T(0), b[i * sb], c[i * sc]);
    } else {
      const T* b = ptr(s.in[1], in, scratch, start);
      const int64_t sb = stride(s.in[1]);
      if (s.out_dtype == DType::kBool) {
        pw::compare_array(s.op, a, sa, b, sb, flags, len);
        for (int64_t i = 0; i < len; ++i) y[i] = T(flags[i]);
      } else if (s.op == OpKind::kDiv && is_integral(s.out_dtype)) {
        for (int64_t i = 0; i < len; ++i) {
          const T d = b[i * sb];
          y[i] = d == T(0) ? T(0) : std::trunc(a[i * sa] / d);
        }
      } else {
        pw::binary_array(s.op, a, sa, b, sb, y, len);
      }
    }
    if (is_integral(s.out_dtype) && fam != OpFamily::kCast)  // wrap like the integer kernels
      for (int64_t i = 0; i < len; ++i) y[i] = static_cast<T>(pw::wrap_integer(double(y[i]), s.out_dtype));
    if constexpr (std::is_same_v<T, double>) {
      // An f32 result in an f64 program rounds to f32 as the f32 kernels' would (on f32 operands,
      // one f64 operation rounded once is the f32 operation's result).
      if (s.out_dtype == DType::kF32 && fam != OpFamily::kCast)
        for (int64_t i = 0; i < len; ++i) y[i] = static_cast<double>(static_cast<float>(y[i]));
    }
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const auto [v, dt] = outputs[k];
    const T* src = ptr(v, in, scratch, start);
    const int64_t sv = stride(v);
    if (dt == compute_dtype<T>() && sv == 1) {
      std::memcpy(static_cast<T*>(out[k]) + start, src, size_t(len) * sizeof(T));
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (sv == 1 && is_floating(dt)) {
        from_f32(src, dt, static_cast<uint8_t*>(out[k]) + start * int64_t(dtype_size(dt)), len);
        continue;
      }
    }
    for (int64_t i = 0; i < len; ++i) {
      if constexpr (std::is_same_v<T, float>) store_f32(out[k], dt, start + i, src[i * sv]);
      else store_double(out[k], dt, start + i, src[i * sv]);
    }
  }
}

template <typename T>
std::shared_ptr<const Program<T>> compile(const Node& n, const Graph& g) {
  const Graph& body = *n.body;
  const std::vector<int64_t> group = g.type(n.outputs[0]).shape();
  auto prog = std::make_shared<Program<T>>();
  Program<T>& p = *prog;
  p.numel = g.type(n.outputs[0]).numel();
  std::vector<int> index(size_t(body.num_values()), -1);
  const int64_t group_numel = p.numel;

  auto view_of = [&](int input) { return input_view(n.op, n.attrs, size_t(input), g.type(n.inputs[size_t(input)])); };
  auto leaf = [&](ValueId v, int input) {
    const TensorType& t = body.type(v);
    typename Program<T>::Ref r;
    r.scalar = t.numel() == 1 && group_numel != 1;
    const OperandView view = input >= 0 ? view_of(input) : dense_view(t);
    const bool dense = (t.shape() == group || t.numel() == group_numel) && view.dense();
    if (input < 0) {
      auto c = std::make_shared<std::vector<T>>(size_t(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) (*c)[size_t(i)] = T(load_as_double(body.value(v).data->data(), t.dtype, i));
      r.constant = c;
    }
    const bool in_place = (r.scalar || dense) && view.offset == 0 && (input < 0 || t.dtype == compute_dtype<T>());
    if (in_place) {
      r.input = input;
    } else {
      r.slot = p.slots++;
      p.loads.push_back({r.slot, input, r.constant, t.dtype, r.scalar,
                         pw::plan_broadcast(group, {t.shape()}, {view.strides}), view.offset});
    }
    index[size_t(v)] = int(p.vals.size());
    p.vals.push_back(r);
  };
  // Body inputs read only by index_select (its data and index) are read through the gather.
  const std::vector<char> gathered = pw::gather_only_inputs(body);
  for (size_t i = 0; i < body.inputs().size(); ++i)
    if (!gathered[i]) leaf(body.inputs()[i], int(i));
  for (ValueId c : body.constants()) leaf(c, -1);
  auto input_of = [&](ValueId v) {
    const int k = pw::input_position(body, v);
    KILN_CHECK(k >= 0, kUnsupported, "fused_pointwise: index_select reads a value computed in the body");
    return k;
  };

  for (const auto& node : body.nodes()) {
    if (node->op == OpKind::kIndexSelect) {
      const TensorType& data = body.type(node->inputs[0]);
      const int64_t axis = node->attrs.get_int("axis");
      int64_t inner = 1;
      for (int64_t d = axis + 1; d < data.rank(); ++d) inner *= data.dims[size_t(d)].extent;
      const OperandView view = view_of(input_of(node->inputs[0]));
      typename Program<T>::Gather q{p.slots++,
                                    input_of(node->inputs[0]),
                                    input_of(node->inputs[1]),
                                    data.dtype,
                                    body.type(node->inputs[1]).dtype,
                                    body.type(node->inputs[1]).numel(),
                                    std::max<int64_t>(inner, 1),
                                    data.dims[size_t(axis)].extent,
                                    pw::plan_broadcast(group, {pw::gathered_shape(body, *node)}),
                                    view.dense() ? std::nullopt : std::optional<OperandView>(view),
                                    view.logical.shape()};
      typename Program<T>::Ref r;
      r.slot = q.slot;
      index[size_t(node->outputs[0])] = int(p.vals.size());
      p.vals.push_back(r);
      p.gathers.push_back(std::move(q));
      continue;
    }
    if (node->op == OpKind::kReshape) {  // of a gathered leaf: the same slot, read in this shape
      const ValueId in = node->inputs[0];
      KILN_CHECK(index[size_t(in)] >= 0 && body.value(in).producer != nullptr &&
                     body.value(in).producer->op == OpKind::kIndexSelect,
                 kUnsupported, "fused_pointwise: a body reshape reads no gathered leaf");
      index[size_t(node->outputs[0])] = index[size_t(in)];
      continue;
    }
    const bool ok = op_info(node->op).pointwise() || node->op == OpKind::kCopy;
    KILN_CHECK(ok, kUnsupported, "fused_pointwise: body op ", op_name(node->op), " is not pointwise");
    KILN_CHECK(node->outputs.size() == 1, kInternal, "fused_pointwise: body op with ", node->outputs.size(), " outputs");
    const TensorType& ot = body.type(node->outputs[0]);
    KILN_CHECK(broadcasts_to(ot.shape(), group), kInternal, "fused_pointwise: body op ", op_name(node->op), " gives ",
               ot.to_string(), ", which does not broadcast to the group shape");
    typename Program<T>::Step s;
    s.op = node->op;
    if (op_info(node->op).family == OpFamily::kUnary) {
      s.params = pw::UnaryParams::from(node->op, node->attrs);
      if (is_integral(ot.dtype)) s.params.lo = std::ceil(s.params.lo), s.params.hi = std::floor(s.params.hi);
    }
    s.out_dtype = ot.dtype;
    for (ValueId in : node->inputs) {
      KILN_CHECK(in >= 0 && index[size_t(in)] >= 0, kInternal, "fused_pointwise: body op ", op_name(node->op),
                 " reads a value defined after it");
      s.in.push_back(index[size_t(in)]);
    }
    typename Program<T>::Ref r;
    r.slot = p.slots++;
    s.out = int(p.vals.size());
    index[size_t(node->outputs[0])] = s.out;
    p.vals.push_back(r);
    p.steps.push_back(std::move(s));
  }
  for (size_t k = 0; k < body.outputs().size(); ++k) {
    KILN_CHECK(body.type(body.outputs()[k]).shape() == group, kInternal, "fused_pointwise: body output ", k, " is ",
               body.type(body.outputs()[k]).to_string(), ", not the group shape");
    p.outputs.emplace_back(index.at(size_t(body.outputs()[k])), g.type(n.outputs[k]).dtype);
  }
  return prog;
}

template <typename T>
std::unique_ptr<Kernel> make(const Node& n, const Graph& g) {
  auto prog = compile<T>(n, g);
  const int64_t blocks = (prog->numel + kBlock - 1) / kBlock;
  const int64_t parts = prog->numel < kSerialBelow ? 1 : std::min<int64_t>(blocks, int64_t(num_threads()) * 4);
  const int64_t per_part = int64_t(prog->slots) * kBlock;
  const size_t ws = size_t(std::max<int64_t>(parts, 1) * per_part) * sizeof(T);
  auto fn = [prog, blocks, parts, per_part, ws](const void* const* in, void* const* out, const RunContext& ctx) {
    KILN_CHECK(ws == 0 || (ctx.workspace && ctx.workspace_size >= ws), kInternal, "fused_pointwise: workspace of ",
               ctx.workspace_size, " bytes, kernel needs ", ws);
    prog->check_indices(in);
    T* scratch = static_cast<T*>(ctx.workspace);
    parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t b = blocks * p / parts; b < blocks * (p + 1) / parts; ++b)
          prog->run_block(in, out, scratch + p * per_part, b * kBlock, std::min(kBlock, prog->numel - b * kBlock));
    });
  };
  std::string desc = "cpu fused_pointwise " + std::to_string(prog->steps.size()) + " ops in " +
                     dtype_name(compute_dtype<T>()) + ", blocks of " + std::to_string(kBlock);
  // A block reads an input of the output's own type only at the block's elements, and stores
  // the (single) output after every read of the block: the output may take that input's bytes.
  // A gathered input, or one read through a view, is read at other positions: never written over.
  std::vector<bool> over(n.inputs.size(), false);
  if (n.outputs.size() == 1 && prog->gathers.empty())
    for (size_t k = 0; k < n.inputs.size(); ++k)
      over[k] =
          n.inputs[k] != kNoValue && g.type(n.inputs[k]) == g.type(n.outputs[0]) && !n.attrs.has(input_view_key(k));
  return make_fn_kernel(fn, desc, ws, std::move(over));
}

// A body that ends in a concat (fuse_pointwise_concats, for CUDA's kernel that computes each part
// in its columns): here each computed part runs as a fused node of its own into the workspace,
// then a concat node joins those and the parts read as they are.
std::unique_ptr<Kernel> make_concat_body_kernel(const Node& n, const Graph& g, const pw::ConcatBody& cb) {
  const Graph& body = *n.body;
  Graph parts;  // the node's inputs, one fused node per computed part, the concat
  std::vector<ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    ins.push_back(parts.add_input("in" + std::to_string(i), g.type(n.inputs[i])));
  std::vector<ValueId> joined;
  Attrs join;
  join.set("axis", cb.axis);
  for (size_t k = 0; k < cb.parts.size(); ++k) {
    KILN_CHECK(!body.value(cb.parts[k]).is_constant(), kUnsupported, "fused_pointwise: a concat part is a constant");
    if (const int j = pw::input_position(body, cb.parts[k]); j >= 0) {
      if (n.attrs.has(input_view_key(size_t(j))))
        join.set(input_view_key(joined.size()), n.attrs.get_ints(input_view_key(size_t(j))));
      joined.push_back(ins[size_t(j)]);
      continue;
    }
    auto sub = std::make_shared<Graph>();
    std::unordered_map<ValueId, ValueId> to_sub;
    std::vector<ValueId> sub_inputs;
    Attrs views;
    for (size_t i = 0; i < body.inputs().size(); ++i) {
      const ValueId v = body.inputs()[i];
      if (cb.part_of[size_t(v)] != int(k)) continue;
      if (n.attrs.has(input_view_key(i)))
        views.set(input_view_key(sub_inputs.size()), n.attrs.get_ints(input_view_key(i)));
      to_sub[v] = sub->add_input("in" + std::to_string(sub_inputs.size()), body.type(v));
      sub_inputs.push_back(ins[i]);
    }
    for (const auto& node : body.nodes()) {
      if (cb.part_of[size_t(node->outputs[0])] != int(k)) continue;
      std::vector<ValueId> args;
      for (ValueId v : node->inputs) {
        if (!to_sub.count(v)) to_sub[v] = sub->add_constant("", body.type(v), body.value(v).data);
        args.push_back(to_sub.at(v));
      }
      const std::vector<ValueId> outs = sub->add_node(node->op, args, node->attrs, node->name);
      for (size_t o = 0; o < outs.size(); ++o) to_sub[node->outputs[o]] = outs[o];
    }
    sub->mark_output(to_sub.at(cb.parts[k]), "out0");
    joined.push_back(parts.insert_fused(parts.nodes().size(), sub_inputs, std::move(sub), n.name, views)[0]);
  }
  parts.mark_output(parts.add_node1(OpKind::kConcat, joined, join, n.name), "out0");

  // Each node's kernel, where its inputs come from (a node input, or a part's place in the
  // workspace) and where its output goes; the parts first in the workspace, then the largest
  // workspace a part's kernel needs.
  struct Step {
    std::shared_ptr<const Kernel> kernel;
    std::vector<std::pair<bool, size_t>> from;  // (in the workspace, node input index or byte offset)
    size_t at = 0;                              // the output's byte offset in the workspace
  };
  std::vector<Step> steps;
  std::unordered_map<ValueId, size_t> placed;
  size_t bytes = 0, scratch = 0;
  for (const auto& node : parts.nodes()) {
    Step st;
    st.kernel = node->op == OpKind::kConcat ? make_shape_kernel(*node, parts) : make_fused_kernel(*node, parts);
    for (ValueId v : node->inputs) {
      const int i = pw::input_position(parts, v);
      st.from.emplace_back(i < 0, i < 0 ? placed.at(v) : size_t(i));
    }
    if (node->op != OpKind::kConcat) {
      st.at = bytes;
      placed[node->outputs[0]] = bytes;
      bytes += (parts.type(node->outputs[0]).nbytes() + 63) / 64 * 64;
    }
    scratch = std::max(scratch, st.kernel->workspace_size());
    steps.push_back(std::move(st));
  }
  const size_t ws = bytes + scratch;
  auto fn = [steps, bytes, ws](const void* const* in, void* const* out, const RunContext& ctx) {
    KILN_CHECK(ws == 0 || (ctx.workspace && ctx.workspace_size >= ws), kInternal, "fused_pointwise: workspace of ",
               ctx.workspace_size, " bytes, kernel needs ", ws);
    auto* base = static_cast<uint8_t*>(ctx.workspace);
    const RunContext inner{ctx.stream, base + bytes, ws - bytes};
    for (const Step& st : steps) {
      std::vector<const void*> args;
      for (const auto& [scratch_part, at] : st.from) args.push_back(scratch_part ? base + at : in[at]);
      void* dst = &st == &steps.back() ? out[0] : static_cast<void*>(base + st.at);
      st.kernel->run(args.data(), &dst, inner);
    }
  };
  return make_fn_kernel(fn, "cpu fused_pointwise concat of " + std::to_string(cb.parts.size()) + " parts", ws);
}

}  // namespace

std::unique_ptr<Kernel> make_fused_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kFusedPointwise && n.body != nullptr, kInternal, "fused_pointwise node without a body");
  const Graph& body = *n.body;
  KILN_CHECK(body.inputs().size() == n.inputs.size() && body.outputs().size() == n.outputs.size(), kInternal,
             "fused_pointwise: body has ", body.inputs().size(), " inputs and ", body.outputs().size(),
             " outputs, node has ", n.inputs.size(), " and ", n.outputs.size());
  if (const std::optional<pw::ConcatBody> cb = pw::concat_body(body)) return make_concat_body_kernel(n, g, *cb);
  // An index_select's index is read as an integer, never computed with: it does not widen.
  std::vector<char> index_only(size_t(body.num_values()), 0);
  const std::vector<char> gathered = pw::gather_only_inputs(body);
  for (const auto& node : body.nodes())
    if (node->op == OpKind::kIndexSelect) {
      const int k = pw::input_position(body, node->inputs[1]);
      if (k >= 0 && gathered[size_t(k)]) index_only[size_t(node->inputs[1])] = 1;
    }
  bool wide = false;
  for (ValueId v = 0; v < body.num_values(); ++v) {
    const DType dt = body.type(v).dtype;
    wide |= !index_only[size_t(v)] && (dt == DType::kF64 || dt == DType::kI64 || dt == DType::kI32);
  }
  return wide ? make<double>(n, g) : make<float>(n, g);
}

}  // namespace kiln::cpu
