// Kiln bundles: a whole compiled program in one file, run without Python.
//
// A bundle holds the engines of a program and its glue: the program's inputs, the engine calls
// in order (each taking program inputs or earlier calls' outputs) and which of those values are
// the program's outputs. kiln.save(..., output_format="kiln_bundle") writes one for a program
// whose every op runs in an engine (python/kiln/bundle.py); kiln-run and Bundle::load read it.
// The byte layout is in src/runtime/bundle_file.h.
//
// Bundle lifecycle: made by Bundle::load / deserialize (every engine loaded, the glue checked
// against the engines' inputs and outputs) or Bundle::of_engine; immutable afterwards and shared
// by its contexts (which hold it).
//
// BundleContext lifecycle: created by Bundle::create_context (one ExecutionContext per call and
// the device buffers of the values passed between calls, allocated once) -> execute()* ->
// destroyed. One context runs one call at a time; several contexts on one bundle run
// concurrently. execute() runs the calls in order on the caller's stream: a call's outputs that
// are program outputs are written straight into the caller's buffers, the others into the
// context's buffers; program outputs that repeat a value or are a program input are copied last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/engine.h"
#include "kiln/size_program.h"

namespace kiln {

// A value of the program: program input `index` (step < 0), or output `index` of call `step`.
struct BundleRef {
  int32_t step = -1;
  uint32_t index = 0;
  bool operator==(const BundleRef& o) const { return step == o.step && index == o.index; }
};

// One engine call: engine `engine` of the bundle on `args` (one per engine input, in order).
struct BundleStep {
  std::string name;  // for messages, e.g. the engine module's name in the compiled program
  uint32_t engine = 0;
  std::vector<BundleRef> args;
};

// A program output: the value `ref`, of type `type` (checked against the value's type).
struct BundleOutput {
  std::string name;
  BundleRef ref;
  TensorType type;
};

// An engine of a dynamic program that serves a range of sizes: it was built at `built_at` (its
// block's symbols), `program` writes the sizes of another binding into its plan
// (kiln/size_program.h), and `pinned` holds the symbols its plan keeps at one value.
struct BundleRange {
  uint32_t engine = 0;
  SymbolBinding built_at;
  SizeProgram program;
  SymbolBinding pinned;
};

// The glue of a bundle. Program inputs and outputs are dense tensors. In a dynamic program
// (kiln.save of a program compiled with dynamic shapes) an input dim may be a symbol with its
// range (Dim::symbol, min, max; the extent is the value the program was compiled at), and every
// engine whose sizes depend on the symbols has a range; Bundle::at makes it static.
struct BundleProgram {
  std::vector<IOTensor> inputs;
  std::vector<BundleStep> steps;
  std::vector<BundleOutput> outputs;
  std::vector<BundleRange> ranges;
};

// The bundle file's bytes for engine files (Engine::serialize's bytes) and their glue. Throws
// kInvalidArgument naming the problem when the program does not fit the engines (a reference to
// a later call, an input of another type than the engine input it feeds, ...), and the engine
// file error (naming the engine) for bytes that are not a readable engine file. The engine files
// are parsed for their inputs and outputs, not loaded: no backend is needed.
Bytes write_bundle(const std::vector<std::span<const uint8_t>>& engine_files, const BundleProgram& program);

class BundleContext;

class Bundle : public std::enable_shared_from_this<Bundle> {
 public:
  // Reads a bundle and loads its engines on `device` (default: the device kind its engines were
  // built for, device 0). Throws kTruncated / kCorrupted / kVersionMismatch naming what is
  // wrong with the file, and an engine's load error (kDeviceMismatch, ...) naming the engine.
  static std::shared_ptr<Bundle> deserialize(const uint8_t* data, size_t size,
                                             const std::optional<Device>& device = std::nullopt);
  // As deserialize, from a file (kIo naming it when it cannot be read; every error names it).
  static std::shared_ptr<Bundle> load(const std::string& path, const std::optional<Device>& device = std::nullopt);
  // A bundle of one call of `engine`: the engine's inputs and outputs are the program's.
  static std::shared_ptr<Bundle> of_engine(std::shared_ptr<Engine> engine);
  // Whether `data` starts as a bundle file does (its magic), to tell it from an engine file.
  static bool has_bundle_magic(const uint8_t* data, size_t size);

  // Whether an input has a symbolic dim: the bundle runs through at(), one binding at a time.
  bool dynamic() const;
  // The binding of the inputs' symbols that inputs of these shapes give (empty for a static
  // bundle). kShapeMismatch naming the input, the dim, the value and the range (or the static
  // extent) for a shape that does not fit, kInvalidArgument for a count or rank that differs.
  SymbolBinding bind(const std::vector<std::vector<int64_t>>& shapes) const;
  // This bundle at `binding` (of every input symbol): a static bundle running each ranged engine
  // as an instance at those sizes (Engine::instance, kernels made now and untimed; the engine
  // itself at the binding it was built at). kUnsupported when an engine's fitted sizes do not
  // hold at `binding` or it holds a symbol at another value; kInvalidArgument for a binding of
  // other symbols. A static bundle returns itself.
  std::shared_ptr<const Bundle> at(const SymbolBinding& binding) const;

  const std::vector<IOTensor>& inputs() const { return program_.inputs; }
  const std::vector<IOTensor>& outputs() const { return outputs_; }  // names and types of program_.outputs
  const BundleProgram& program() const { return program_; }
  const std::vector<std::shared_ptr<Engine>>& engines() const { return engines_; }
  const Device& device() const { return device_; }
  // The Kiln version that wrote the file ("" for of_engine).
  const std::string& kiln_version() const { return kiln_version_; }

  // A dynamic bundle's context runs at(bind(the inputs' compiled extents)).
  std::unique_ptr<BundleContext> create_context(bool use_graphs = true) const;
  // Convenience: host bytes of each input in, host bytes of each output out, on a context made
  // for this call (make one with create_context for repeated calls).
  std::vector<Bytes> run(const std::vector<Bytes>& inputs) const;

 private:
  Bundle() = default;
  // Checks the program against the engines (kCorrupted when it does not fit) and fills outputs_.
  void finish();

  BundleProgram program_;
  std::vector<IOTensor> outputs_;
  std::vector<std::shared_ptr<Engine>> engines_;
  Device device_;
  std::string kiln_version_;
};

class BundleContext {
 public:
  explicit BundleContext(std::shared_ptr<const Bundle> bundle, bool use_graphs = true);
  BundleContext(const BundleContext&) = delete;
  BundleContext& operator=(const BundleContext&) = delete;

  // Buffers are dense, of the bundle's input/output types, on the bundle's device, in the order
  // of Bundle::inputs() / outputs(). `stream` is a cudaStream_t on CUDA (null: default). Only the
  // counts are checked (kInvalidArgument), as ExecutionContext::execute does.
  void execute(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, void* stream = nullptr);
  // Host buffers in (each exactly its input's bytes: kInvalidArgument naming the input if not),
  // host buffers out; copies through device memory off the CPU and waits for the results.
  std::vector<Bytes> run(const std::vector<Bytes>& inputs);

  const Bundle& bundle() const { return *bundle_; }

 private:
  // Where a value lives during a call.
  struct Place {
    enum Kind : uint8_t { kInput, kOutput, kBuffer } kind = kInput;
    size_t index = 0;
  };
  const void* address(const Place& p, const std::vector<const void*>& in, const std::vector<void*>& out) const;

  std::shared_ptr<const Bundle> bundle_;
  Backend* backend_ = nullptr;
  std::vector<std::unique_ptr<ExecutionContext>> calls_;  // one per step
  std::vector<std::vector<Place>> step_places_;           // per step, per engine output
  std::vector<std::shared_ptr<void>> buffers_;            // values that are no caller output
  struct Copy {                                           // program outputs filled last
    size_t output;
    Place from;
    size_t bytes;
  };
  std::vector<Copy> copies_;
  std::vector<const void*> in_scratch_;
  std::vector<void*> out_scratch_;
};

}  // namespace kiln
