// lower_precision: runs a graph in f16 or bf16 (`compute`) while its interface stays f32.
//
// Does:
//   - every f32 value computed inside the graph becomes `compute`: each node is rebuilt, in
//     order, on its inputs' lowered values, and its shape rule gives the new output types
//     (every op's output dtype follows its floating inputs or a dtype attribute);
//   - f32 graph inputs keep their type; a cast to `compute` follows each (made at its first
//     use, shared by the rest); f32 graph outputs keep their type and name behind a cast back
//     to f32;
//   - f32 constants (weights included) keep their bytes and are read through one cast node
//     each: the fold_constants that follows this pass evaluates those casts, so the engine
//     stores narrow weights, and records them so a refit casts new weights the same way;
//   - attributes holding a dtype (cast's `dtype`, full / arange `dtype`) that say f32 say
//     `compute`; a cast to the type its input now has is dropped (its readers read the input;
//     a graph output it was reads it too, through a copy where the input is a graph input or
//     another output).
// Does not: touch integer, bool or f64 values (a cast from them to f32 now casts to
// `compute`); convert any constant's bytes; keep any op in f32 for accuracy (every kernel
// accumulates in f32 internally: matmul, conv, reductions, softmax, norms); lower a graph that
// already has fused_pointwise nodes (kInvalidArgument: run it before fuse_pointwise, since a
// body's scalar constants cannot take a cast node); decide whether lowering is wanted (the
// builder calls it when the config enables f16 / bf16 on a GPU). Value ids change (the graph
// is rebuilt); value names, weights, node names and which values are sized stay.
#include <vector>

#include "kiln/errors.h"
#include "kiln/passes.h"

namespace kiln {

namespace {

bool has_f32(const Graph& g) {
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (g.type(v).dtype == DType::kF32) return true;
  for (const auto& n : g.nodes())
    for (const auto& [key, val] : n->attrs.items())
      if (const DType* t = std::get_if<DType>(&val); t && *t == DType::kF32) return true;
  return false;
}

class Lowering {
 public:
  Lowering(const Graph& src, DType compute)
      : src_(src), compute_(compute), wide_(size_t(src.num_values()), kNoValue),
        narrow_(size_t(src.num_values()), kNoValue) {}

  Graph run() {
    for (ValueId in : src_.inputs()) wide_[size_t(in)] = dst_.add_input(src_.value(in).name, src_.type(in));
    for (ValueId c : src_.constants()) {
      const Value& v = src_.value(c);
      wide_[size_t(c)] = dst_.add_constant(v.name, v.type, v.data, v.is_weight);
    }
    for (const auto& n : src_.nodes()) lower_node(*n);
    // An output that a dropped cast left on a named value (an input, another output) gets a
    // copy of its own from mark_output.
    for (ValueId out : src_.outputs()) dst_.mark_output(wide(out), src_.value(out).name);
    return std::move(dst_);
  }

 private:
  ValueId cast(ValueId v, DType to) {
    Attrs a;
    a.set("dtype", to);
    return dst_.add_node1(OpKind::kCast, {v}, a);
  }

  // v as the graph computes it now: `compute` for an f32 value, v's own type otherwise.
  ValueId lowered(ValueId v) {
    if (v == kNoValue) return kNoValue;
    ValueId& n = narrow_[size_t(v)];
    if (n != kNoValue) return n;
    const ValueId w = wide_[size_t(v)];
    KILN_CHECK(w != kNoValue, kInternal, "lower_precision: %", v, " used before it is defined");
    if (dst_.type(w).dtype != DType::kF32) return w;
    return n = cast(w, compute_);
  }

  // v in its original type (f32 stays f32): for graph outputs.
  ValueId wide(ValueId v) {
    ValueId& w = wide_[size_t(v)];
    if (w != kNoValue) return w;
    return w = cast(lowered(v), src_.type(v).dtype);
  }

  void lower_node(const Node& n) {
    std::vector<ValueId> ins;
    for (ValueId in : n.inputs) ins.push_back(lowered(in));
    Attrs attrs = n.attrs;
    for (const auto& [key, val] : n.attrs.items())
      if (const DType* t = std::get_if<DType>(&val); t && *t == DType::kF32) attrs.set(key, compute_);
    // A cast to what its input is now (a model's upcast for accuracy, x.float() before a norm,
    // or its cast of an f32 input, which this pass casts already) is that input, not a copy.
    if (n.op == OpKind::kCast && dst_.type(ins[0]).dtype == attrs.get_dtype("dtype")) {
      const size_t v = size_t(n.outputs[0]);
      (src_.type(n.outputs[0]).dtype == DType::kF32 ? narrow_[v] : wide_[v]) = ins[0];
      dst_.value(ins[0]).sized = dst_.value(ins[0]).sized || src_.value(n.outputs[0]).sized;
      return;
    }
    const std::vector<ValueId> outs = dst_.add_node(n.op, ins, attrs, n.name);
    KILN_CHECK(outs.size() == n.outputs.size(), kInternal, "lower_precision: ", op_name(n.op), " has ",
               n.outputs.size(), " outputs, rebuilt with ", outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      const TensorType& was = src_.type(n.outputs[i]);
      const TensorType& now = dst_.type(outs[i]);
      const size_t v = size_t(n.outputs[i]);
      dst_.value(outs[i]).sized = src_.value(n.outputs[i]).sized;  // still left to run (Value::sized)
      if (now.dtype == was.dtype) {
        wide_[v] = outs[i];  // unchanged (an f32 one is cast at its first use)
      } else {
        KILN_CHECK(was.dtype == DType::kF32 && now.dtype == compute_, kInternal, "lower_precision: ",
                   op_name(n.op), " output ", i, " was ", was.to_string(), ", became ", now.to_string());
        narrow_[v] = outs[i];
      }
    }
  }

  const Graph& src_;
  DType compute_;
  Graph dst_;
  std::vector<ValueId> wide_;    // per source value: its value in dst_ with the source's dtype
  std::vector<ValueId> narrow_;  // per source f32 value: its `compute` value in dst_
};

}  // namespace

bool lower_precision(Graph& g, DType compute) {
  KILN_CHECK(compute == DType::kF16 || compute == DType::kBF16, kInvalidArgument,
             "lower_precision: compute type must be f16 or bf16, got ", dtype_name(compute));
  for (const auto& n : g.nodes())
    KILN_CHECK(n->op != OpKind::kFusedPointwise, kInvalidArgument,
               "lower_precision: the graph has fused_pointwise nodes; run it before fuse_pointwise");
  if (!has_f32(g)) return false;
  g = Lowering(g, compute).run();
  return true;
}

}  // namespace kiln
