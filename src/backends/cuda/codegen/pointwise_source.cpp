// The CUDA source of a pointwise program (see pointwise_program.h): the prelude, the integer and
// vector helpers (cuh/pointwise_helpers.cuh), a device function computing every output of one
// element from its leaf values, and the kernels that index the inputs and call it.
//
// Literals are written as hexadecimal floats (exact); constants, sizes and strides are read
// from the by-value argument block, so nodes differing only in them share one source.
#include <cinttypes>
#include <cmath>
#include <limits>
#include <sstream>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/backends/cuda/codegen/prelude.h"

namespace kiln::cuda::pwgen {

namespace {

// The concatenation of string pieces, appended one by one.
template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  ((s += a), ...);
  return s;
}

// prefix + decimal i (a helper rather than "v" + std::to_string(i), which trips a false
// -Wrestrict in GCC 12's std::string operator+).
std::string id(const char* prefix, int64_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

std::string ilit(int64_t v, DType t) {
  std::string s = v == std::numeric_limits<int64_t>::min() ? "(-9223372036854775807LL - 1)" : std::to_string(v) + "LL";
  return std::string("((") + reg_type(t) + ")" + s + ")";
}

std::string load_expr(DType t, const std::string& e) {
  if (t == DType::kF16 || t == DType::kBF16) return "to_float(" + e + ")";
  if (t == DType::kBool) return "(" + e + " != 0)";
  return e;
}

std::string store_expr(DType t, const std::string& e) {
  if (t == DType::kF16) return "from_float<kiln_half>(" + e + ")";
  if (t == DType::kBF16) return "from_float<kiln_bf16>(" + e + ")";
  if (t == DType::kBool) return "(unsigned char)(" + e + " ? 1 : 0)";
  return e;
}

std::string cast_expr(DType from, DType to, const std::string& x) {
  if (from == to) return x;
  if (to == DType::kBool) return "((" + x + ") != 0)";
  if (to == DType::kF32) return "((float)(" + x + "))";
  if (to == DType::kF64) return "((double)(" + x + "))";
  if (to == DType::kF16) return "to_float(from_float<kiln_half>((float)(" + x + ")))";
  if (to == DType::kBF16) return "to_float(from_float<kiln_bf16>((float)(" + x + ")))";
  if (is_floating(from)) return std::string("((") + reg_type(to) + ")kiln_f2i((double)(" + x + ")))";
  return std::string("((") + reg_type(to) + ")(" + x + "))";
}

// Math function names: the f suffix for float registers.
std::string fn(const char* base, DType t) { return std::string(base) + (t == DType::kF64 ? "" : "f"); }

template <typename T>
int64_t int_bound_of(DType, double v, bool lower) {
  return int64_t(pw::int_bound<T>(v, lower));
}

int64_t int_bound(DType t, double v, bool lower) {
  switch (t) {
    case DType::kI64: return int_bound_of<int64_t>(t, v, lower);
    case DType::kI32: return int_bound_of<int32_t>(t, v, lower);
    case DType::kI8: return int_bound_of<int8_t>(t, v, lower);
    default: return int_bound_of<uint8_t>(t, v, lower);
  }
}

// The statements computing step `s` into `out` (declared by the caller) from value names.
std::string step_code(const Step& s, const std::vector<DType>& dtype, const std::string& out) {
  auto v = [&](size_t k) { return id("v", s.in.at(k)); };
  const DType in = dtype[size_t(s.in.at(0))];
  const std::string R = reg_type(s.out);
  const bool fl = is_floating(in);
  const OpFamily fam = op_info(s.op).family;
  std::string e;
  if (s.op == OpKind::kCopy) {
    e = v(0);
  } else if (fam == OpFamily::kCast) {
    e = cast_expr(in, s.out, v(0));
  } else if (fam == OpFamily::kWhere) {
    e = cat("(", v(0), " ? ", v(1), " : ", v(2), ")");
  } else if (fam == OpFamily::kUnary) {
    const std::string x = v(0);
    const pw::UnaryParams& p = s.params;
    switch (s.op) {
      case OpKind::kRelu:
        e = fl ? "kiln_relu(" + x + ")" : (in == DType::kU8 ? x : "(" + x + " < 0 ? (" + R + ")0 : " + x + ")");
        break;
      case OpKind::kGelu: e = cat((p.gelu_tanh ? "kiln_gelu_tanh(" : "kiln_gelu("), x, ")"); break;
      case OpKind::kSilu: e = cat("kiln_silu(", x, ")"); break;
      case OpKind::kSigmoid: e = cat("kiln_sigmoid(", x, ")"); break;
      case OpKind::kTanh: e = cat(fn("tanh", in), "(", x, ")"); break;
      case OpKind::kExp: e = cat(fn("exp", in), "(", x, ")"); break;
      case OpKind::kLog: e = cat(fn("log", in), "(", x, ")"); break;
      case OpKind::kSqrt: e = cat(fn("sqrt", in), "(", x, ")"); break;
      case OpKind::kRsqrt: e = cat("(", float_literal(1.0, in), " / ", fn("sqrt", in), "(", x, "))"); break;
      case OpKind::kNeg: e = fl ? "(-" + x + ")" : "kiln_ineg(" + x + ")"; break;
      case OpKind::kAbs: e = fl ? fn("fabs", in) + "(" + x + ")" : "kiln_iabs(" + x + ")"; break;
      case OpKind::kErf: e = cat(fn("erf", in), "(", x, ")"); break;
      case OpKind::kHardswish: e = cat("kiln_hardswish(", x, ")"); break;
      case OpKind::kHardsigmoid: e = cat("kiln_hardsigmoid(", x, ")"); break;
      case OpKind::kReciprocal: e = cat("(", float_literal(1.0, in), " / ", x, ")"); break;
      case OpKind::kSin: e = cat(fn("sin", in), "(", x, ")"); break;
      case OpKind::kCos: e = cat(fn("cos", in), "(", x, ")"); break;
      case OpKind::kLogicalNot: e = cat("((", R, ")(", x, " == 0))"); break;
      case OpKind::kLeakyRelu: e = cat("kiln_leaky_relu(", x, ", ", float_literal(p.slope, in), ")"); break;
      case OpKind::kSign:  // (0 < x) - (x < 0): NaN and -0 give +0, as the CPU
        if (fl) {
          const std::string zero = float_literal(0.0, in), one = float_literal(1.0, in);
          e = cat("((", x, " > ", zero, " ? ", one, " : ", zero, ") - (", x, " < ", zero, " ? ", one, " : ", zero,
                  "))");
        } else {
          e = in == DType::kU8 ? cat("(", x, " != 0)") : cat("((", x, " > 0) - (", x, " < 0))");
        }
        break;
      case OpKind::kFloor: e = cat(fn("floor", in), "(", x, ")"); break;
      case OpKind::kCeil: e = cat(fn("ceil", in), "(", x, ")"); break;
      case OpKind::kRound: e = cat(fn("rint", in), "(", x, ")"); break;  // half to even
      case OpKind::kTrunc: e = cat(fn("trunc", in), "(", x, ")"); break;
      case OpKind::kClamp: {
        // min(max(x, lo), hi): an absent (infinite) bound never changes x, NaN included.
        std::string lo, hi;
        if (fl) {
          if (!std::isinf(p.lo) || p.lo > 0) lo = float_literal(p.lo, in);
          if (!std::isinf(p.hi) || p.hi < 0) hi = float_literal(p.hi, in);
        } else {
          lo = ilit(int_bound(in, p.lo, true), in);
          hi = ilit(int_bound(in, p.hi, false), in);
        }
        std::string t = x;
        if (!lo.empty()) t = "(" + t + " < " + lo + " ? " + lo + " : " + t + ")";
        if (!hi.empty()) {
          return cat("  const ", R, " ", out, "_t = ", t, ";\n  const ", R, " ", out, " = ", out, "_t > ", hi, " ? ",
                     hi, " : ", out, "_t;\n");
        }
        e = t;
        break;
      }
      default: e = x; break;
    }
  } else {
    const std::string a = v(0), b = v(1);
    switch (s.op) {
      case OpKind::kAdd: e = fl ? "(" + a + " + " + b + ")" : "kiln_iadd(" + a + ", " + b + ")"; break;
      case OpKind::kSub: e = fl ? "(" + a + " - " + b + ")" : "kiln_isub(" + a + ", " + b + ")"; break;
      case OpKind::kMul: e = fl ? "(" + a + " * " + b + ")" : "kiln_imul(" + a + ", " + b + ")"; break;
      case OpKind::kDiv: e = fl ? "(" + a + " / " + b + ")" : "kiln_idiv(" + a + ", " + b + ")"; break;
      case OpKind::kPow: e = cat(fn("pow", in), "(", a, ", ", b, ")"); break;
      case OpKind::kMaximum: e = cat("kiln_max(", a, ", ", b, ")"); break;
      case OpKind::kMinimum: e = cat("kiln_min(", a, ", ", b, ")"); break;
      case OpKind::kEq: e = cat("(", a, " == ", b, ")"); break;
      case OpKind::kNe: e = cat("(", a, " != ", b, ")"); break;
      case OpKind::kLt: e = cat("(", a, " < ", b, ")"); break;
      case OpKind::kLe: e = cat("(", a, " <= ", b, ")"); break;
      case OpKind::kGt: e = cat("(", a, " > ", b, ")"); break;
      case OpKind::kGe: e = cat("(", a, " >= ", b, ")"); break;
      case OpKind::kLogicalAnd: e = cat("(", a, " != 0 && ", b, " != 0)"); break;
      case OpKind::kLogicalOr: e = cat("(", a, " != 0 || ", b, " != 0)"); break;
      default: e = a; break;
    }
  }
  return cat("  const ", R, " ", out, " = (", R, ")", e, ";\n");
}

}  // namespace

std::string generate(const Program& p, const Layout& l) {
  std::ostringstream s;
  s << prelude() << embedded_source("pointwise_helpers.cuh");
  const int leaves = p.num_leaves();
  const size_t nconst = p.const_slot.size();
  const int first_gather = p.num_inputs + int(nconst);  // value index of gathered leaf 0
  // Inputs read element by element: not one element for all, not read only through a gather.
  auto elementwise = [&](int i) { return !l.scalar[size_t(i)] && !p.pointer_only[size_t(i)]; };
  int dense = int(p.gathers.size());
  for (int i = 0; i < p.num_inputs; ++i) dense += elementwise(i) ? 1 : 0;
  // The argument block, as argument_block() fills it.
  s << "struct KilnPwArgs {\n  long long n;\n";
  if (!l.flat) s << "  long long dims[" << l.rank << "];\n";
  if (!l.flat && dense) s << "  long long st[" << dense << "][" << l.rank << "];\n";
  const bool parts = p.concat_dim >= 0;
  if (parts) s << "  long long cb[" << p.part_start.size() << "];\n  long long ob[" << std::max(dense, 1) << "];\n";
  if (!p.const_float.empty()) s << "  double cf[" << p.const_float.size() << "];\n";
  if (!p.const_int.empty()) s << "  long long ci[" << p.const_int.size() << "];\n";
  // Per gathered leaf: its count and inner size and the data's dim, then its view's sizes and
  // strides (argument_block), so that a node at other sizes shares the source.
  const size_t ng = p.gathers.size();
  if (ng) s << "  kiln_divisor gc[" << ng << "];\n  kiln_divisor gi[" << ng << "];\n  long long gd[" << ng << "];\n";
  for (size_t k = 0; k < ng; ++k) {
    const size_t r = p.gathers[k].view_sizes.size();
    if (r) s << "  kiln_divisor gvs" << k << "[" << r << "];\n  long long gvt" << k << "[" << r << "];\n";
  }
  s << "};\n\n";
  // Gathered leaf k's data read through a view: its logical element o (row-major over the view's
  // sizes) at the buffer offset sum(digit * stride); sizes and strides are arguments (by value:
  // the kernel reads them straight from the argument block).
  for (size_t k = 0; k < ng; ++k) {
    const size_t r = p.gathers[k].view_sizes.size();
    if (!r) continue;
    s << "template <typename T>\n__device__ __forceinline__ long long kiln_gview" << k << "(T o";
    for (size_t d = 1; d < r; ++d) s << ", kiln_divisor s" << d;
    for (size_t d = 0; d < r; ++d) s << ", long long t" << d;
    s << ") {\n  long long r = 0;\n  T q;\n";
    for (size_t d = r; d-- > 1;)
      s << "  q = kiln_div(o, s" << d << "); r += (long long)(o - q * (T)s" << d << ".d) * t" << d << "; o = q;\n";
    s << "  return r + (long long)o * t0;\n}\n\n";
  }

  // One element: leaf values in, every output's register value out.
  s << "__device__ __forceinline__ void kiln_pw_body(";
  for (int i = 0; i < leaves; ++i) s << (i ? ", " : "") << reg_type(p.dtype[size_t(i)]) << " v" << i;
  if (parts) s << ", int part";
  for (size_t k = 0; k < p.outputs.size(); ++k) s << ", " << reg_type(p.dtype[size_t(p.outputs[k])]) << "& o" << k;
  s << ") {\n";
  if (!parts) {
    for (size_t k = 0; k < p.steps.size(); ++k) s << step_code(p.steps[k], p.dtype, id("v", leaves + int(k)));
  } else {
    // Only the element's part is computed: each part's steps in a branch of their own, ending in
    // the concat's value (the last step).
    const Step& join = p.steps.back();
    const std::string y = id("v", leaves + int(p.steps.size()) - 1);
    s << "  " << reg_type(join.out) << " " << y << ";\n";
    for (size_t part = 0; part < join.in.size(); ++part) {
      s << (part ? " else if" : "  if") << " (part == " << part << ") {\n";
      for (size_t k = 0; k + 1 < p.steps.size(); ++k)
        if (p.steps[k].part == int(part)) s << "  " << step_code(p.steps[k], p.dtype, id("v", leaves + int(k)));
      s << "    " << y << " = v" << join.in[part] << ";\n  }";
    }
    s << "\n";
  }
  for (size_t k = 0; k < p.outputs.size(); ++k) s << "  o" << k << " = v" << p.outputs[k] << ";\n";
  s << "}\n\n";

  const std::string I = l.wide ? "long long" : "unsigned int";
  auto params = [&] {
    std::string r;
    for (int i = 0; i < p.num_inputs; ++i)
      r += std::string("const ") + store_type(p.dtype[size_t(i)]) + "* __restrict__ in" + std::to_string(i) + ", ";
    for (size_t k = 0; k < p.outputs.size(); ++k)
      r += std::string(store_type(p.dtype[size_t(p.outputs[k])])) + "* __restrict__ out" + std::to_string(k) + ", ";
    return r + "const KilnPwArgs a";
  };
  // Scalars, constants and (strided) sizes, read once per thread.
  auto preamble = [&] {
    std::ostringstream t;
    t << "  const " << I << " n = (" << I << ")a.n;\n";
    for (int i = 0; i < p.num_inputs; ++i)
      if (l.scalar[size_t(i)])
        t << "  const " << reg_type(p.dtype[size_t(i)]) << " l" << i << " = "
          << load_expr(p.dtype[size_t(i)], id("in", i) + "[0]") << ";\n";
      else if (p.pointer_only[size_t(i)])
        t << "  const " << reg_type(p.dtype[size_t(i)]) << " l" << i << " = 0;\n";  // read through gathers
    for (size_t c = 0; c < nconst; ++c) {
      const int v = p.num_inputs + int(c);
      const DType dt = p.dtype[size_t(v)];
      const std::string src = is_floating(dt) ? "a.cf[" + std::to_string(p.const_slot[c]) + "]"
                                              : "a.ci[" + std::to_string(p.const_slot[c]) + "]";
      t << "  const " << reg_type(dt) << " l" << v << " = (" << reg_type(dt) << ")" << src << ";\n";
    }
    t << "  const " << I << " tid = (" << I << ")blockIdx.x * blockDim.x + threadIdx.x;\n";
    t << "  const " << I << " step = (" << I << ")gridDim.x * blockDim.x;\n";
    return t.str();
  };
  // The body call for element `i` with leaf expressions `leaf` and stores to the outputs.
  auto element = [&](const std::vector<std::string>& leaf, const std::string& indent, bool vec_store) {
    std::ostringstream t;
    for (size_t k = 0; k < p.outputs.size(); ++k)
      t << indent << reg_type(p.dtype[size_t(p.outputs[k])]) << " r" << k << ";\n";
    t << indent << "kiln_pw_body(";
    for (int i = 0; i < leaves; ++i) t << (i ? ", " : "") << leaf[size_t(i)];
    if (parts) t << ", part";
    for (size_t k = 0; k < p.outputs.size(); ++k) t << ", r" << k;
    t << ");\n";
    for (size_t k = 0; k < p.outputs.size(); ++k) {
      const DType dt = p.dtype[size_t(p.outputs[k])];
      t << indent << (vec_store ? id("y", k) + ".v[k]" : id("out", k) + "[i]") << " = " << store_expr(dt, id("r", k))
        << ";\n";
    }
    return t.str();
  };
  std::vector<std::string> leaf(static_cast<size_t>(leaves));
  for (int i = p.num_inputs; i < leaves; ++i) leaf[size_t(i)] = id("l", i);

  // Strided layouts: the dims, and per non-scalar input i its element offset o<i> of the output
  // element `index` (a row-major walk of the collapsed dims).
  auto dim_defs = [&] {
    std::ostringstream t;
    for (int d = 0; d < l.rank; ++d) t << "  const " << I << " d" << d << " = (" << I << ")a.dims[" << d << "];\n";
    return t.str();
  };
  // Gathered leaf k's offset into its virtual result is og<k>.
  auto offsets = [&](const std::string& index) {
    std::ostringstream t;
    t << "    " << I << " rem = " << index << ", c;\n";
    // A concat program's reads start at their part's base (a wrapped unsigned value until the
    // column is added), and the column along the concat dim picks the part.
    int row = 0;
    auto base = [&] { return parts ? cat("(", I, ")a.ob[", std::to_string(row++), "]") : std::string("0"); };
    for (int i = 0; i < p.num_inputs; ++i)
      if (elementwise(i)) t << "    " << I << " o" << i << " = " << base() << ";\n";
    for (size_t k = 0; k < p.gathers.size(); ++k) t << "    " << I << " og" << k << " = " << base() << ";\n";
    if (parts) t << "    " << I << " cax = 0;\n";
    for (int d = l.rank - 1; d >= 0; --d) {
      if (d > 0) t << "    c = rem % d" << d << "; rem /= d" << d << ";\n";
      else t << "    c = rem;\n";
      if (parts && d == p.concat_dim) t << "    cax = c;\n";
      int k = 0;
      for (int i = 0; i < p.num_inputs; ++i)
        if (elementwise(i)) t << "    o" << i << " += c * (" << I << ")a.st[" << k++ << "][" << d << "];\n";
      for (size_t q = 0; q < p.gathers.size(); ++q)
        t << "    og" << q << " += c * (" << I << ")a.st[" << k++ << "][" << d << "];\n";
    }
    if (parts) {
      t << "    const int part = 0";
      for (size_t k = 1; k + 1 < p.part_start.size(); ++k) t << " + (cax >= (" << I << ")a.cb[" << k << "])";
      t << ";\n";
    }
    return t.str();
  };
  // The data offset of gathered leaf k at its result offset `e`.
  auto gather_at = [&](size_t k, const std::string& e) {
    const Gather& q = p.gathers[k];
    const std::string ks = std::to_string(k);
    const std::string dense = cat("kiln_gather((", I, ")(", e, "), in", std::to_string(q.index), ", a.gc[", ks,
                                  "], a.gi[", ks, "], a.gd[", ks, "])");
    if (q.view_sizes.empty()) return dense;
    // The view's logical offsets in 32 bits (quotients without a division) unless they reach 2^30.
    int64_t numel = 1;
    for (int64_t d : q.view_sizes) numel *= d;
    const char* O = numel < (int64_t(1) << 30) ? "unsigned int" : "long long";
    std::string call = cat("kiln_gview", ks, "((", O, ")(", dense, ")");
    for (size_t d = 1; d < q.view_sizes.size(); ++d) call += cat(", a.gvs", ks, "[", std::to_string(d), "]");
    for (size_t d = 0; d < q.view_sizes.size(); ++d) call += cat(", a.gvt", ks, "[", std::to_string(d), "]");
    return call + ")";
  };
  auto gather_leaf = [&](size_t k, const std::string& e) {
    const int data = p.gathers[k].data;
    return load_expr(p.dtype[size_t(data)], cat("in", std::to_string(data), "[", gather_at(k, e), "]"));
  };

  // The grid-stride kernel (flat or strided).
  s << "extern \"C\" __global__ void __launch_bounds__(256) kiln_pw(" << params() << ") {\n" << preamble();
  if (!l.flat) s << dim_defs();
  s << "  for (" << I << " i = tid; i < n; i += step) {\n";
  if (!l.flat) s << offsets("i");
  // A concat program loads a leaf only in its part's columns (elsewhere its offset may be out of
  // range): the other parts compute on zeros, and their values are not taken.
  auto in_part = [&](int part, const std::string& zero, const std::string& load) {
    return part < 0 ? load : cat("(part == ", std::to_string(part), " ? ", load, " : ", zero, ")");
  };
  auto zero = [](DType t) { return cat("(", reg_type(t), ")0"); };
  for (int i = 0; i < p.num_inputs; ++i)
    leaf[size_t(i)] =
        !elementwise(i) ? id("l", i)
                        : in_part(parts ? p.input_part[size_t(i)] : -1, zero(p.dtype[size_t(i)]),
                                  load_expr(p.dtype[size_t(i)], id("in", i) + "[" + (l.flat ? "i" : id("o", i)) + "]"));
  for (size_t k = 0; k < p.gathers.size(); ++k)
    leaf[size_t(first_gather) + k] = in_part(p.gathers[k].part, zero(p.dtype[size_t(p.gathers[k].data)]),
                                             gather_leaf(k, l.flat ? "i" : id("og", int64_t(k))));
  s << element(leaf, "    ", false) << "  }\n}\n";

  if (l.vec > 1) {
    // Vectors of V elements: flat, or strided with every non-scalar input's V elements
    // consecutive and starting on a multiple of V, or one element of a splat input (layout_of),
    // whose offsets are then walked once per vector; the innermost dim is a multiple of V, so a
    // strided layout has no tail.
    const std::string V = std::to_string(l.vec);
    s << "\nextern \"C\" __global__ void __launch_bounds__(256) kiln_pw_vec(" << params() << ") {\n" << preamble();
    if (!l.flat) s << dim_defs();
    s << "  const " << I << " nv = n / " << V << ";\n";
    s << "  for (" << I << " j = tid; j < nv; j += step) {\n";
    if (!l.flat) s << offsets("j * " + V);
    // A concat program's vector lies in one part: the other parts' leaves are zeros.
    for (int i = 0; i < p.num_inputs; ++i) {
      if (!elementwise(i)) continue;
      const int part = parts ? p.input_part[size_t(i)] : -1;
      const std::string st = store_type(p.dtype[size_t(i)]), vt = cat("kiln_vec<", st, ", ", V, ">");
      if (l.splat[size_t(i)])
        s << "    const " << reg_type(p.dtype[size_t(i)]) << " x" << i << " = "
          << in_part(part, zero(p.dtype[size_t(i)]),
                     load_expr(p.dtype[size_t(i)], id("in", i) + "[" + id("o", i) + "]"))
          << ";\n";
      else
        s << "    const " << vt << " x" << i << " = "
          << in_part(part, vt + "{}",
                     cat("kiln_vload<", st, ", ", V, ">(in", std::to_string(i), ", ",
                         l.flat ? std::string("j") : id("o", i) + " / " + V, ")"))
          << ";\n";
    }
    for (size_t k = 0; k < p.gathers.size(); ++k) {  // V elements inside one index's block (layout_of)
      const std::string st = store_type(p.dtype[size_t(p.gathers[k].data)]), vt = cat("kiln_vec<", st, ", ", V, ">");
      s << "    const " << vt << " xg" << k << " = "
        << in_part(p.gathers[k].part, vt + "{}",
                   cat("kiln_vload<", st, ", ", V, ">(in", std::to_string(p.gathers[k].data), ", ",
                       gather_at(k, l.flat ? "j * " + V : id("og", int64_t(k))), " / ", V, ")"))
        << ";\n";
    }
    for (size_t k = 0; k < p.outputs.size(); ++k)
      s << "    kiln_vec<" << store_type(p.dtype[size_t(p.outputs[k])]) << ", " << V << "> y" << k << ";\n";
    s << "#pragma unroll\n    for (int k = 0; k < " << V << "; ++k) {\n";
    std::vector<std::string> vleaf = leaf;
    for (int i = 0; i < p.num_inputs; ++i)
      vleaf[size_t(i)] = !elementwise(i)      ? id("l", i)
                         : l.splat[size_t(i)] ? id("x", i)
                                              : load_expr(p.dtype[size_t(i)], id("x", i) + ".v[k]");
    for (size_t k = 0; k < p.gathers.size(); ++k)
      vleaf[size_t(first_gather) + k] = load_expr(p.dtype[size_t(p.gathers[k].data)], id("xg", int64_t(k)) + ".v[k]");
    s << element(vleaf, "      ", true) << "    }\n";
    for (size_t k = 0; k < p.outputs.size(); ++k)
      s << "    kiln_vstore<" << store_type(p.dtype[size_t(p.outputs[k])]) << ", " << V << ">(out" << k << ", j, y" << k
        << ");\n";
    s << "  }\n";
    if (!l.flat) return s.str() + "}\n";
    // The tail (n % V elements) elementwise.
    s << "  for (" << I << " i = nv * " << V << " + tid; i < n; i += step) {\n";
    std::vector<std::string> tleaf = leaf;
    for (int i = 0; i < p.num_inputs; ++i)
      tleaf[size_t(i)] = !elementwise(i) ? id("l", i) : load_expr(p.dtype[size_t(i)], id("in", i) + "[i]");
    for (size_t k = 0; k < p.gathers.size(); ++k) tleaf[size_t(first_gather) + k] = gather_leaf(k, "i");
    s << element(tleaf, "    ", false) << "  }\n}\n";
  }
  return s.str();
}

}  // namespace kiln::cuda::pwgen
