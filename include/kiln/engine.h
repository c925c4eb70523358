// Engine and ExecutionContext: what the builder produces and what runs it.
//
// Engine lifecycle: constructed by Engine::create (Builder::build: the backend chooses every
// kernel), by Engine::deserialize / load / load_mapped (the kernels chosen at build are made
// again from the states the file keeps) or by instance() (the same plan at other sizes, on
// another engine's constants); afterwards only a Refitter changes it (its weights, in place:
// kiln/refit.h, through the "changing constants in place" calls below). Construction
// uploads the constants to the device and makes one Kernel per node; both are shared by every
// context. A refittable engine (one with a refit program) owns private, writable host copies of
// the constants a refit may write. An engine outlives its contexts (contexts hold it).
//
// ExecutionContext lifecycle: created by Engine::create_execution_context (allocates the
// activation arena and workspace once) -> execute()* -> destroyed. execute() checks the
// buffers it is given, runs every kernel in order on the caller's stream and returns; a
// failed check throws before any kernel runs and leaves the context usable. One context
// runs one call at a time; several contexts on one engine run concurrently.
//
// With graph replay (on a backend that captures, i.e. CUDA, and unless turned off), the first
// execute() captures every kernel launch into one graph on the caller's own buffers, replayed
// with no copies whenever a call brings those buffers again (a loop over one input tensor, or
// over outputs that the caller's allocator hands back at the same addresses). A call with other
// buffers uses a second graph, captured once on staging buffers the context then allocates (one
// per engine input and output): it copies the inputs in, replays, and copies the outputs out, so
// the caller's buffers may change from call to call. Buffers that come again within the next two
// calls with other buffers (outputs alternating between two addresses while the caller holds the
// last one) get a graph of their own too. Up to kMaxDirectGraphs graphs on caller buffers are
// kept (the oldest goes) and kMaxDirectCaptures captured in a context's life (then buffers that
// keep changing settle on the staging graph); an output that overlaps an input or another output
// always goes through staging. After a refit (Engine::weights_version() changed) the next
// execute() captures again, since a refit may remake kernels.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ir.h"
#include "kiln/passes.h"

namespace kiln {

inline constexpr const char* kKilnVersion = "0.1.0";

struct IOTensor {
  std::string name;
  TensorType type;
};

// A weight an engine may read where its owner keeps it instead of from a copy of its own: `size`
// bytes at `data` on the engine's device, dense, in the plan weight's type, kept alive by
// `owner`. Engine::create reads a plan weight (a constant named as a weight, with the weight's
// bytes) from there when the size matches and `data` has the backend's alignment, and copies it
// otherwise. The engine then sees changes made to those bytes in place; the weights a refit
// writes become the engine's own again (Refitter never writes into a borrowed weight).
struct BorrowedWeight {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};
using BorrowedWeights = std::map<std::string, BorrowedWeight>;

class ExecutionContext;

// Activation memory that the contexts of several engines share: the instances of one range
// (Engine::instance), whose callers run one of them at a time. Made by Engine::allocate_arena.
struct SharedArena {
  std::shared_ptr<void> data;
  size_t bytes = 0;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // The build path: takes an optimized, verified plan and has the backend choose every kernel
  // (Builder::build calls it after the passes; tests use it to run a plan as given). The log is
  // `build_log`, then each kernel's choice, a "kernels:" line (the slowest to make) and a
  // "memory:" line. `refit_program` (kiln/refit.h; null: immutable weights) must name plan
  // constants of its output types and take plan weights of their own types (kCorrupted naming
  // the value if not). `borrowed`: weights to read in place rather than copy (see
  // BorrowedWeight). Engine files are read by deserialize / load / load_mapped.
  static std::shared_ptr<Engine> create(Graph plan, const Device& device, const KernelOptions& options,
                                        std::string build_log = {},
                                        std::shared_ptr<const Graph> refit_program = nullptr,
                                        const BorrowedWeights& borrowed = {});

  const std::vector<IOTensor>& inputs() const { return inputs_; }
  const std::vector<IOTensor>& outputs() const { return outputs_; }
  std::vector<std::string> weight_names() const;
  const Graph& graph() const { return plan_; }
  const MemoryPlan& memory_plan() const { return memory_; }
  const Device& device() const { return device_; }
  const std::string& build_log() const { return log_; }
  const KernelOptions& kernel_options() const { return options_; }
  size_t workspace_size() const { return workspace_; }
  // Bytes of plan weights read in place from their owners' memory (BorrowedWeight).
  size_t borrowed_bytes() const;
  // Whether a Refitter can change the weights (a refit program was kept), and the program.
  bool refittable() const { return refit_program_ != nullptr; }
  const Graph* refit_program() const { return refit_program_.get(); }
  // Incremented by every refit.
  uint64_t weights_version() const { return weights_version_; }
  // An opaque identifier of the source weights the constants were built or refitted from, set
  // by a front end (the engine cache keeps a fingerprint of the model's weights here, so that a
  // hit with the same weights needs no refit). Saved in engine files; a refit clears it, since
  // the constants then come from other weights.
  const std::string& source_weights_id() const { return source_weights_id_; }
  void set_source_weights_id(std::string id) { source_weights_id_ = std::move(id); }

  // Changing constants in place: what a Refitter (kiln/refit.h) does to a refittable engine.
  // write_constant() gives plan weights and refit targets new host bytes, in the engine's own
  // copies; publish_constants() then makes the kernels read them. No context of the engine may
  // execute from the first write until publish_constants() returns.
  //
  // The constant that refit program output `output` re-derives: a plan constant or a constant
  // of a fused node's body, named as the output and of its type.
  const Value& refit_target(size_t output) const;
  // The engine's own, writable host bytes of `constant` (a plan weight of graph() or a
  // refit_target()), where a refit may compute its new value directly; null for any other.
  uint8_t* writable_bytes(const Value& constant);
  // Makes the `size` bytes at `bytes` the new value of `constant`, a plan weight or a refit
  // target (copied unless they are its writable_bytes() already). kInternal when the constant
  // holds another number of bytes or is not one the engine lets a refit write.
  void write_constant(const Value& constant, const void* bytes, size_t size);
  // What publish_constants() did.
  struct Published {
    double device_ms = 0;  // waiting for the device, then the device copies
    int kernels_remade = 0;
    double kernels_ms = 0;
  };
  // Makes the constants written since the last call the ones the kernels read: waits for work
  // queued on the device (a forward still running reads the old values, whole); a written
  // weight read in place from its owner's memory becomes the engine's own (a new device copy,
  // whose address contexts take on their next call), the device copies of the other written
  // constants are overwritten; every kernel that read a written constant when it was made
  // (Kernel::bakes_constants) is made again from its state. Then weights_version() counts one
  // more and source_weights_id() is cleared. kInternal when a kernel made again needs more
  // workspace than the engine has.
  Published publish_constants();

  // An instance: an engine running `plan`, this engine's plan with other sizes (SizeProgram::
  // evaluate of it: the same values, nodes and constant bytes), on this engine's constants, which
  // it shares (device copies and borrowed weights) instead of copying. Its kernels are made for its
  // sizes with `options` (level 0: untimed), and its contexts allocate arenas of their own. An
  // instance has no refit program; once this engine's weights change (a refit) it refuses to run
  // (kInvalidArgument) and is made again. kInvalidArgument when `plan` does not share this engine's
  // constants or this engine is an instance itself.
  std::shared_ptr<Engine> instance(Graph plan, const KernelOptions& options) const;
  // The engine whose constants this one runs on; null unless an instance.
  const Engine* instance_of() const { return parent_.get(); }

  // use_graphs: replay a captured graph per call where the backend can (see above). `arena`: the
  // context's activations go there when it holds memory_plan().arena_bytes (else the context
  // allocates its own); the caller runs no two contexts sharing it at once.
  std::unique_ptr<ExecutionContext> create_execution_context(bool use_graphs = true,
                                                             std::shared_ptr<SharedArena> arena = nullptr) const;
  // `bytes` of activation memory on this engine's device, for contexts to share.
  std::shared_ptr<SharedArena> allocate_arena(size_t bytes) const;
  // The arena an engine for `plan` (on a backend of `alignment`) needs at most: its memory plan
  // with no output written over an input.
  static size_t arena_bound(const Graph& plan, size_t alignment);

  // Engine files: see src/serialize/engine_file.h for the format.
  Bytes serialize() const;
  // The file of this engine with the kernels of `kernels`, an instance of it at its own sizes
  // (instance(graph(), ...): e.g. tactics timed where this engine was built untimed), their
  // choices and optimization level in place of its own: loading it makes those kernels.
  // kInvalidArgument for an engine that is no such instance.
  Bytes serialize_with_kernels_of(const Engine& kernels) const;
  // Throws kTruncated / kCorrupted / kVersionMismatch / kDeviceMismatch naming the problem.
  static std::shared_ptr<Engine> deserialize(const uint8_t* data, size_t size, const Device& device = Device{});
  void save(const std::string& path) const;
  static std::shared_ptr<Engine> load(const std::string& path, const Device& device = Device{});
  // As load, but maps the file copy-on-write instead of reading it: the engine's host constants
  // are views of the file's pages (no copy: the page cache's pages, shared between processes),
  // and a refit's writes stay private to the process. The file must not be rewritten in place
  // while the engine lives (replace it by rename, as the engine cache does): its pages would
  // change under the engine, or fault (SIGBUS) if the file were truncated.
  static std::shared_ptr<Engine> load_mapped(const std::string& path, const Device& device = Device{});

 private:
  friend class ExecutionContext;
  Engine() = default;
  // What assemble() measured, for the log lines of create and restore.
  struct Assembly {
    std::vector<double> kernel_ms;  // per node: making its kernel
    double kernels_ms = 0;          // making every kernel
    double constants_ms = 0;        // uploading the constants (0 on the CPU)
    size_t block_bytes = 0;         // the device block: constants, then maybe one context's memory
  };
  // The part create and restore share: checks the plan and refit program, places the
  // constants (borrowed or the engine's own), makes the kernels (from `kernel_states`, one per
  // node, when not null: kCorrupted for another count), plans memory and uploads the constants.
  // The log is left to the caller.
  static std::shared_ptr<Engine> assemble(Graph plan, const Device& device, const KernelOptions& options,
                                          std::shared_ptr<const Graph> refit_program, const BorrowedWeights& borrowed,
                                          const std::vector<Bytes>* kernel_states, Assembly& assembly);
  // Makes the kernels of plan_ with options_ (from `kernel_states` as in assemble), then the
  // workspace size and the memory plan; kInvalidArgument when the workspace exceeds the limit.
  void choose_kernels(const std::vector<Bytes>* kernel_states, Assembly& assembly);
  // kInvalidArgument when this is an instance whose parent's weights changed since it was made.
  void check_current() const;
  // The load path (engine files): the kernels chosen at build made again from `kernel_states`
  // (empty: every state empty); the log is `log`, then a "load:" line.
  static std::shared_ptr<Engine> restore(Graph plan, const Device& device, const KernelOptions& options,
                                         std::string log, const std::vector<Bytes>& kernel_states,
                                         std::shared_ptr<const Graph> refit_program);
  // deserialize; with an `owner`, the weights are views of `data` (which the owner keeps alive
  // and which the engine may write) instead of copies.
  static std::shared_ptr<Engine> from_file_bytes(const uint8_t* data, size_t size, const Device& device,
                                                 std::shared_ptr<void> owner);
  void own_refittable_constants();
  // " (slowest: op 'name' T ms, ...)" of the nodes whose kernels took longest to make, and "\n".
  std::string slowest_kernels(const std::vector<double>& kernel_ms) const;
  // The arena and workspace room in constant_memory_ for one context at a time (null when taken
  // or absent); giving the pointer back frees the room for the next context.
  std::shared_ptr<void> take_context_memory() const;
  // Makes constant `c` the engine's own again if it is borrowed (before a refit writes it).
  void stop_borrowing(ValueId c);

  Graph plan_;
  Device device_;
  KernelOptions options_;
  std::string log_;
  MemoryPlan memory_;
  std::vector<IOTensor> inputs_, outputs_;
  Backend* backend_ = nullptr;
  std::vector<std::unique_ptr<Kernel>> kernels_;       // one per plan node
  std::vector<Bytes> kernel_states_;                   // Kernel::state() per node (engine files)
  std::shared_ptr<void> constant_memory_;               // device copies of the constants, one block,
  void* context_memory_ = nullptr;                      // then one context's arena and workspace
  mutable std::atomic<bool> context_memory_taken_{false};
  std::vector<const void*> constant_ptr_;               // per ValueId, null unless constant
  std::vector<void*> device_copy_;                      // per ValueId: the engine's own device copy, or null
  std::vector<std::shared_ptr<const void>> borrowed_;  // per ValueId: the owner of a borrowed weight
  std::vector<std::shared_ptr<void>> own_copies_;      // device copies of weights borrowed before a refit
  size_t workspace_ = 0;
  std::shared_ptr<const Graph> refit_program_;  // null: immutable weights
  std::vector<Value*> refit_targets_;           // per program output: the plan (or fused body) constant
  // The engine's own host bytes of plan weights and refit targets, writable, by address; and
  // those written since the last publish_constants().
  std::unordered_map<const HostBuffer*, std::shared_ptr<HostBuffer>> writable_;
  std::unordered_set<const HostBuffer*> written_;
  uint64_t weights_version_ = 0;
  std::string source_weights_id_;
  std::shared_ptr<const Engine> parent_;  // an instance's: whose constants it runs on
  uint64_t parent_version_ = 0;  // the parent's weights_version() when the instance was made
};

class ExecutionContext {
 public:
  // Graphs on the caller's buffers kept at once, and captured in a context's life.
  static constexpr size_t kMaxDirectGraphs = 2;
  static constexpr int kMaxDirectCaptures = 8;

  explicit ExecutionContext(std::shared_ptr<const Engine> engine, bool use_graphs = true,
                            std::shared_ptr<SharedArena> arena = nullptr);
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;

  // Buffers are dense, of the engine's input/output types, on the engine's device, in the
  // order of Engine::inputs() / outputs(). `stream` is a cudaStream_t on CUDA (null: default).
  void execute(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, void* stream = nullptr);
  // The same with each buffer's shape and dtype checked against the engine (kShapeMismatch /
  // kInvalidArgument naming the tensor).
  void execute_checked(const std::vector<const void*>& inputs, const std::vector<TensorType>& input_types,
                       const std::vector<void*>& outputs, const std::vector<TensorType>& output_types,
                       void* stream = nullptr);

  const Engine& engine() const { return *engine_; }
  bool uses_graphs() const { return use_graphs_; }
  // Whether the activations live in a SharedArena given at creation.
  bool shares_arena() const { return shares_arena_; }
  // Why graph replay was given up for direct launches ("" when it was not).
  const std::string& graph_refusal() const { return graph_refusal_; }
  // Graphs captured so far: on the caller's own buffers and on the staging buffers (each again
  // after a refit).
  int graph_captures() const { return graph_captures_; }

 private:
  void launch_all(void* stream);
  void bind_constants();  // slot_ of every constant, from the engine's current addresses
  void bind(const std::vector<const void*>& inputs, const std::vector<void*>& outputs);
  // Whether an output's bytes overlap an input's or another output's.
  bool overlapping(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) const;

  std::shared_ptr<const Engine> engine_;
  std::shared_ptr<void> arena_;
  std::shared_ptr<void> workspace_;
  std::vector<void*> slot_;                  // per ValueId: where the value lives during a call
  std::vector<std::vector<ValueId>> node_in_, node_out_;
  std::vector<const void*> in_ptrs_;         // scratch reused across calls
  std::vector<void*> out_ptrs_;
  bool use_graphs_ = false;
  bool shares_arena_ = false;
  std::vector<std::shared_ptr<void>> staging_;  // graph replay: one buffer per engine input, then output
  std::unique_ptr<CapturedGraph> graph_;  // on staging_
  struct Buffers {  // the caller's buffers of one call
    std::vector<const void*> in;
    std::vector<void*> out;
    bool same(const std::vector<const void*>& i, const std::vector<void*>& o) const { return in == i && out == o; }
  };
  struct DirectGraph {  // a graph on the caller's buffers
    Buffers buffers;
    std::unique_ptr<CapturedGraph> graph;
  };
  std::vector<DirectGraph> direct_;  // the newest last
  std::vector<Buffers> seen_;        // recent buffers without a graph of their own
  int direct_captures_ = 0;
  int graph_captures_ = 0;
  uint64_t captured_version_ = 0;  // the engine's weights_version() when the graphs were captured
  uint64_t bound_version_ = 0;     // ... when slot_ took the constants' addresses (a refit may move one)
  std::string graph_refusal_;
};

}  // namespace kiln
