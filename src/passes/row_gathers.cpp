// Row gathers (row_gathers.h) and chains_to_row_gathers.
//
// The rows of a chain are found by running it on row numbers instead of elements: a row is
// `width` consecutive indices of one dim (innermost at the chain's start). A permute moves the
// row dim with the others, an index_select picks along another dim, and a reshape keeps the rows
// whole where one of its dims holds them with the same elements inside; anything else ends the
// search. The chain's rows are a gather when the row dim is innermost again at its end.
//
// chains_to_row_gathers: for each value y made by a chain of reshape, permute and index_select
// (by a constant 1-D index) nodes, each value before y read by the next node alone, with at least
// two copies among them (permutes that move a dim of extent > 1, index_selects), replaces the
// longest such chain whose rows are a gather by that gather (the widest rows first). Chains of
// more than kMaxRows rows stay.
#include <algorithm>
#include <numeric>

#include "kiln/passes.h"
#include "src/ops/access.h"
#include "src/passes/pass_util.h"
#include "src/passes/row_gathers.h"

namespace kiln::passes {

namespace {

constexpr int64_t kMaxRows = int64_t(1) << 22;

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// One node of a chain as the rows see it.
struct Step {
  OpKind op = OpKind::kReshape;  // kReshape, kPermute or kIndexSelect
  std::vector<int64_t> out;      // the node's output shape
  Perm perm;                     // kPermute
  int64_t axis = -1;             // kIndexSelect
  std::vector<int64_t> pick;     // kIndexSelect
};

// The rows a value holds: its shape with dim `dim` divided by the row width (a row is `width`
// consecutive indices of that dim), and per row, row-major, the number of the source row.
struct Rows {
  std::vector<int64_t> shape;
  size_t dim = 0;
  std::vector<int64_t> src;
};

// out.src[k] = in.src[offset(k)], the offset stepping `stride[i]` per index of out dim i; along
// `axis` (if any) through `pick`.
std::vector<int64_t> move_rows(const Rows& in, const std::vector<int64_t>& out_shape,
                               const std::vector<int64_t>& stride, int64_t axis = -1,
                               const std::vector<int64_t>& pick = {}) {
  std::vector<int64_t> out(static_cast<size_t>(product(out_shape, 0, out_shape.size())));
  const size_t rank = out_shape.size();
  std::vector<int64_t> at(rank, 0);
  for (int64_t& dst : out) {
    int64_t off = 0;
    for (size_t i = 0; i < rank; ++i) off += (int64_t(i) == axis ? pick[size_t(at[i])] : at[i]) * stride[i];
    dst = in.src[size_t(off)];
    for (size_t i = rank; i-- > 0;) {
      if (++at[i] < out_shape[i]) break;
      at[i] = 0;
    }
  }
  return out;
}

// Moves the rows as step does; false when the step splits a row or mixes rows.
bool apply(Rows& r, const Step& step, int64_t width) {
  if (step.op == OpKind::kReshape) {
    // The rows stay whole where one dim of the new shape holds them with the same elements
    // inside (the dims after it hold as many elements as those after the row dim did).
    const int64_t inner = product(r.shape, r.dim + 1, r.shape.size());
    for (size_t k = 0; k < step.out.size(); ++k)
      if (step.out[k] % width == 0 && product(step.out, k + 1, step.out.size()) == inner) {
        r.shape = step.out;
        r.shape[k] /= width;
        r.dim = k;
        return true;
      }
    return false;
  }
  const std::vector<int64_t> st = row_major_strides(r.shape);
  if (step.op == OpKind::kPermute) {
    std::vector<int64_t> shape(step.perm.size()), stride(step.perm.size());
    size_t dim = 0;
    for (size_t i = 0; i < step.perm.size(); ++i) {
      shape[i] = r.shape[size_t(step.perm[i])];
      stride[i] = st[size_t(step.perm[i])];
      if (step.perm[i] == int64_t(r.dim)) dim = i;
    }
    r.src = move_rows(r, shape, stride);
    r.shape = std::move(shape);
    r.dim = dim;
    return true;
  }
  if (step.axis < 0 || step.axis >= int64_t(r.shape.size()) || step.axis == int64_t(r.dim)) return false;
  std::vector<int64_t> pick = step.pick, shape = r.shape;
  const int64_t dim = r.shape[size_t(step.axis)];
  for (int64_t& i : pick) {
    if (i < 0) i += dim;
    if (i < 0 || i >= dim) return false;  // the kernels' own error, at build or run time
  }
  shape[size_t(step.axis)] = int64_t(pick.size());
  r.src = move_rows(r, shape, st, step.axis, pick);
  r.shape = std::move(shape);
  return true;
}

// The rows of a value of shape x (rows of its innermost dim) after the steps, or none.
std::optional<Rows> run_steps(const std::vector<int64_t>& x, int64_t width, const std::vector<Step>& steps) {
  if (x.empty() || width < 1 || x.back() % width != 0) return std::nullopt;
  Rows r{x, x.size() - 1, {}};
  r.shape.back() /= width;
  const int64_t m = product(r.shape, 0, r.shape.size());
  if (m > kMaxRows) return std::nullopt;
  r.src.resize(size_t(m));
  std::iota(r.src.begin(), r.src.end(), 0);
  for (const Step& step : steps)
    if (!apply(r, step, width) || int64_t(r.src.size()) > kMaxRows) return std::nullopt;
  return r;
}

// The gather of rows r (whose row dim is last) from a source of shape x (rows of `width`): the
// largest lead (a product of leading dims of r or of x: a batch, also where the output merged
// it with the windows) over which the source rows repeat block by block.
RowGather blocks_of(const Rows& r, const std::vector<int64_t>& x, int64_t width) {
  const auto m = int64_t(r.src.size());
  const int64_t source_rows = product(x, 0, x.size()) / width;
  std::vector<int64_t> leads;
  for (size_t k = 1; k < r.shape.size(); ++k) leads.push_back(product(r.shape, 0, k));
  for (size_t k = 1; k < x.size(); ++k) leads.push_back(product(x, 0, k));
  std::sort(leads.rbegin(), leads.rend());
  RowGather g;
  g.width = width;
  for (int64_t lead : leads) {
    if (lead == 1) break;
    if (m % lead != 0 || source_rows % lead != 0) continue;
    const int64_t out = m / lead, in = source_rows / lead;
    bool repeats = true;
    for (int64_t i = 0; i < m && repeats; ++i)
      repeats = r.src[size_t(i)] == (i / out) * in + r.src[size_t(i % out)] && r.src[size_t(i % out)] < in;
    if (repeats) {
      g.lead = lead;
      g.rows = in;
      g.index.assign(r.src.begin(), r.src.begin() + out);
      return g;
    }
  }
  g.rows = source_rows;
  g.index = r.src;
  return g;
}

// A constant 1-D integer index, as int64.
std::optional<std::vector<int64_t>> constant_index(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (!val.is_constant() || val.type.rank() != 1 || (val.type.dtype != DType::kI64 && val.type.dtype != DType::kI32))
    return std::nullopt;
  std::vector<int64_t> out;
  for (double x : constant_as_doubles(g, v)) out.push_back(int64_t(x));
  return out;
}

bool chain_op(const Graph& g, const Node& n) {
  if (n.op == OpKind::kReshape || n.op == OpKind::kPermute) return true;
  return n.op == OpKind::kIndexSelect && n.inputs.size() == 2 && constant_index(g, n.inputs[1]).has_value();
}

// The row gather doing what `chain` (first to last) does: at least two copies, the widest
// rows that every value keeps whole, none when no rows of 16-byte words do.
std::optional<RowGather> chain_gather(const Graph& g, const std::vector<const Node*>& chain) {
  const TensorType& x = g.type(chain.front()->inputs[0]);
  const TensorType& y = g.type(chain.back()->outputs[0]);
  if (!all_static(x) || x.rank() == 0 || y.rank() == 0) return std::nullopt;
  std::vector<Step> steps;
  int64_t copies = 0;
  for (const Node* n : chain) {
    const TensorType& t = g.type(n->outputs[0]);
    if (!all_static(t)) return std::nullopt;
    Step s;
    s.op = n->op;
    s.out = t.shape();
    if (n->op == OpKind::kPermute) {
      s.perm = perm_of(*n);
      copies += !keeps_order(g.type(n->inputs[0]).shape(), s.perm);
    } else if (n->op == OpKind::kIndexSelect) {
      s.axis = n->attrs.get_int("axis");
      s.pick = *constant_index(g, n->inputs[1]);
      ++copies;
    }
    steps.push_back(std::move(s));
  }
  if (copies < 2) return std::nullopt;
  for (int64_t width = std::gcd(x.dims.back().extent, y.dims.back().extent); gatherable_row(width, x.dtype);
       width /= 2) {
    const std::optional<Rows> r = run_steps(x.shape(), width, steps);
    if (r && r->dim + 1 == r->shape.size()) return blocks_of(*r, x.shape(), width);
    if (width % 2 != 0) break;
  }
  return std::nullopt;
}

}  // namespace

bool RowGather::identity() const {
  if (int64_t(index.size()) != rows) return false;
  for (size_t k = 0; k < index.size(); ++k)
    if (index[k] != int64_t(k)) return false;
  return true;
}

bool gatherable_row(int64_t width, DType dt) { return width > 0 && (width * int64_t(dtype_size(dt))) % 16 == 0; }

std::optional<PermutedRows> rows_through(const std::vector<int64_t>& vs, const Perm& p, const std::vector<int64_t>& s,
                                         DType dt) {
  if (vs.size() < 2 || p.size() != vs.size() || !gatherable_row(vs.back(), dt)) return std::nullopt;
  Step permute{OpKind::kPermute, {}, p, -1, {}}, reshape{OpKind::kReshape, s, {}, -1, {}};
  for (int64_t d : p) permute.out.push_back(vs[size_t(d)]);
  const int64_t width = vs.back();
  std::optional<Rows> r = run_steps(vs, width, {permute, reshape});
  if (!r) return std::nullopt;
  // The gather writes s with the row dim last; a permute puts it back.
  PermutedRows out;
  Step last{OpKind::kPermute, {}, {}, -1, {}};
  for (size_t k = 0; k < s.size(); ++k)
    if (k != r->dim) last.perm.push_back(int64_t(k));
  last.perm.push_back(int64_t(r->dim));
  out.perm.assign(s.size(), 0);
  for (size_t i = 0; i < last.perm.size(); ++i) {
    last.out.push_back(s[size_t(last.perm[i])]);
    out.perm[size_t(last.perm[i])] = int64_t(i);
  }
  if (!apply(*r, last, width)) return std::nullopt;
  out.z = last.out;
  out.gather = blocks_of(*r, vs, width);
  return out;
}

ValueId insert_row_gather(Graph& g, size_t& pos, ValueId x, const RowGather& rows, const std::string& name) {
  NodeInserter at{g, pos, name};
  ValueId y = at.reshape(x, {rows.lead, rows.rows, rows.width});
  if (!rows.identity()) {
    const ValueId idx = g.add_constant(derived_constant_name(g, "row_gather.index"),
                                       TensorType(DType::kI64, {int64_t(rows.index.size())}), rows.index.data(),
                                       rows.index.size() * sizeof(int64_t), false);
    Attrs a;
    a.set("axis", int64_t{1});
    y = at.node(OpKind::kIndexSelect, {y, idx}, a);
  }
  pos = at.pos;
  return y;
}

}  // namespace kiln::passes

namespace kiln {

bool chains_to_row_gathers(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (!passes::chain_op(g, n)) continue;
    // The chain ends here unless the next node continues it.
    const ValueId y = n.outputs[0];
    if (passes::read_once(g, y)) {
      bool continues = false;
      for (size_t k = pos + 1; k < g.nodes().size() && !continues; ++k) {
        const Node& m = *g.nodes()[k];
        continues = !m.inputs.empty() && m.inputs[0] == y && passes::chain_op(g, m);
      }
      if (continues) continue;
    }
    std::vector<const Node*> chain = {&n};
    for (const Node* p = g.value(n.inputs[0]).producer;
         p != nullptr && passes::chain_op(g, *p) && passes::read_once(g, p->outputs[0]);
         p = g.value(p->inputs[0]).producer)
      chain.insert(chain.begin(), p);
    for (size_t first = 0; first + 1 < chain.size(); ++first) {
      const std::vector<const Node*> part(chain.begin() + std::ptrdiff_t(first), chain.end());
      const std::optional<passes::RowGather> rows = passes::chain_gather(g, part);
      if (!rows || (rows->identity() && passes::is_graph_output(g, y))) continue;
      Attrs a;
      a.set("shape", g.type(y).shape());
      size_t at = pos;
      const ValueId gathered = passes::insert_row_gather(g, at, part.front()->inputs[0], *rows, n.name);
      passes::replace_node(g, at, OpKind::kReshape, {gathered}, a);
      pos = at;
      changed = true;
      break;
    }
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

}  // namespace kiln
