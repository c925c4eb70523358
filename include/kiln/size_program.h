// SizeProgram: the sizes of a plan as functions of shape symbols, so that one optimized plan
// serves every size in a range (docs/dynamic-shapes.md, "Instances").
//
// The passes see concrete shapes. A front end optimizes the same network at a few bindings of
// its symbols (batch = 3, batch = 5, ...) and hands the plans to fit(): where they agree in
// everything but integers (the nodes, ops, value ids, dtypes, names, constants' bytes, every
// non-integer attribute), each integer (an extent, an integer attribute or a float one holding a
// whole number, an element of an
// integer-list attribute or of a small i64 / i32 constant, such as an index an importer computed
// from a size; fused bodies included) that differs between them is fitted as a
// multilinear function of the symbols (a + b*s for one symbol, a + b*s + c*t + d*s*t for two),
// from the samples at the corners of a grid, plus where that misses, a square term per symbol
// (q * (s - lo) * (s - hi), zero at the corners: s*s, an index flattened over two dims of one
// length), its coefficient from a check sample that moves that symbol alone and verified at another
// such sample; then checked against every other sample. A plan that
// differs in anything else, or an integer that the function does not reproduce, is refused with
// the first difference named. evaluate() then writes the fitted integers into a copy of the first
// sample's plan (or a plan equal to it, e.g. an engine's) for any binding and verifies the result
// against every op's shape rule.
//
// What fit() cannot see: an integer that is such a function at every sample but not between them
// (a min() whose bend lies outside the samples). Front ends take samples spread over the range,
// and only fit blocks whose symbolic sizes are polynomials of degree at most 2 in each symbol.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/ir.h"

namespace kiln {

using SymbolBinding = std::map<std::string, int64_t>;

struct SizeSample {
  SymbolBinding binding;
  Graph plan;
};

class SizeProgram {
 public:
  // Symbols are the keys of samples[0].binding (every sample binds the same ones). With n of them,
  // samples[0 .. 2^n) are the corners of a grid: symbol i (in key order) has one value where bit i
  // of the sample's index is 0 and another where it is 1; the other samples (at least one) check
  // the fit. kInvalidArgument for samples that break this, kUnsupported naming the first
  // difference that is not a fitted integer.
  static SizeProgram fit(const std::vector<SizeSample>& samples);

  // `base` (a plan equal to samples[0]'s) with every fitted integer evaluated at `binding`,
  // verified. A constant with fitted elements gets new bytes; the others stay base's buffers. kInvalidArgument for a binding of other symbols or a base of another structure,
  // kUnsupported when a fitted integer is not whole or not valid at `binding` (the program does
  // not hold there), naming it.
  Graph evaluate(const Graph& base, const SymbolBinding& binding) const;

  // Its bytes (little-endian, src/builder/size_program.cpp), for bundles (kiln/bundle.h), and back.
  // deserialize throws kCorrupted naming what is malformed (a count past the end, a grid that is
  // not 2^n corners); a program read back from damaged bytes that names integers its base does
  // not have fails in evaluate (kInvalidArgument), as a program for another plan does.
  Bytes serialize() const;
  static SizeProgram deserialize(const uint8_t* data, size_t size);

  const std::vector<std::string>& symbols() const { return symbols_; }
  size_t fitted() const { return slots_.size(); }  // integers that depend on the symbols
  std::string to_string() const;                   // one line per fitted integer, for logs and tests

  // One integer of a plan: where it is and its value at each grid corner.
  struct Slot {
    std::vector<size_t> body;  // node indices leading into nested fused bodies (empty: the plan)
    enum Kind : uint8_t { kExtent, kAttr, kFloatAttr, kAttrElement, kConstant } kind = kExtent;
    size_t index = 0;          // the value (kExtent, kConstant) or node (attributes)
    std::string key;           // the attribute
    size_t element = 0;        // the dim (kExtent), list element (kAttrElement) or constant element
    std::vector<int64_t> corners;
    // Per symbol, the coefficient num / den (den > 0) of (x - lo) * (x - hi) added to the corners'
    // interpolation; empty where the interpolation alone fits.
    std::vector<std::pair<int64_t, int64_t>> squares;
    std::string where() const;  // "value 12 dim 0", "node 3 attr 'shape'[1]"
  };

 private:
  std::vector<std::string> symbols_;
  std::vector<int64_t> lo_, hi_;  // per symbol: its value at bit 0 and bit 1 of a corner's index
  std::vector<Slot> slots_;
};

}  // namespace kiln
