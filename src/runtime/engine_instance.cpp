// Engine::instance: an engine for other sizes of the same plan, on its parent's constants
// (kiln/engine.h; the plans come from SizeProgram::evaluate, kiln/size_program.h).
#include <iomanip>
#include <sstream>

#include "kiln/engine.h"
#include "kiln/errors.h"
#include "src/runtime/device_block.h"

namespace kiln {

std::shared_ptr<Engine> Engine::instance(Graph plan, const KernelOptions& options) const {
  KILN_CHECK(parent_ == nullptr, kInvalidArgument, "an engine instance cannot be instantiated again; instantiate ",
             "the engine it is an instance of");
  plan.verify();
  KILN_CHECK(plan.num_values() == plan_.num_values() && plan.inputs().size() == plan_.inputs().size() &&
                 plan.outputs().size() == plan_.outputs().size(),
             kInvalidArgument, "instance: the plan has ", plan.num_values(), " values, ", plan.inputs().size(),
             " inputs and ", plan.outputs().size(), " outputs; the engine's has ", plan_.num_values(), ", ",
             plan_.inputs().size(), " and ", plan_.outputs().size());
  // The constants are read where this engine keeps them where the plan holds the same bytes (the
  // same buffers, as a copy of this engine's plan does); a constant with bytes of its own (a size
  // SizeProgram::evaluate wrote into it) is the instance's own copy.
  std::vector<ValueId> own;
  for (ValueId c = 0; c < plan_.num_values(); ++c) {
    const Value &mine = plan.value(c), &theirs = plan_.value(c);
    KILN_CHECK(mine.is_constant() == theirs.is_constant() && (!mine.is_constant() || mine.type == theirs.type),
               kInvalidArgument, "instance: value ", c, " ('", theirs.name,
               "') is not this engine's constant (the plan must be a copy of graph())");
    if (mine.is_constant() && mine.data != theirs.data) own.push_back(c);
  }
  std::shared_ptr<Engine> e(new Engine());
  e->plan_ = std::move(plan);
  e->device_ = device_;
  e->options_ = options;
  e->options_.derived = options_.derived;  // the data its kernels derive from the shared constants
  e->backend_ = backend_;
  e->parent_ = shared_from_this();
  e->parent_version_ = weights_version_;
  e->constant_ptr_ = constant_ptr_;
  e->device_copy_.assign(constant_ptr_.size(), nullptr);  // nothing of its own for a refit to write
  e->borrowed_ = borrowed_;
  size_t total = 0;
  for (ValueId c : own) {
    KILN_CHECK(!borrowed_[size_t(c)] && !plan_.value(c).is_weight, kInvalidArgument, "instance: weight '",
               plan_.value(c).name, "' has other bytes than the engine's");
    total += block_rounded(backend_->alignment(), e->plan_.value(c).data->size());
  }
  if (device_.type == DeviceType::kCPU) {
    for (ValueId c : own) e->constant_ptr_[size_t(c)] = e->plan_.value(c).data->data();
  } else if (total) {
    e->constant_memory_ = backend_->allocate(total);
    std::vector<Backend::HostCopy> copies;
    size_t at = 0;
    for (ValueId c : own) {
      const HostBuffer& bytes = *e->plan_.value(c).data;
      void* p = static_cast<uint8_t*>(e->constant_memory_.get()) + at;
      copies.push_back({p, bytes.data(), bytes.size()});
      e->constant_ptr_[size_t(c)] = p;
      at += block_rounded(backend_->alignment(), bytes.size());
    }
    backend_->upload(copies);
  }
  for (ValueId in : e->plan_.inputs()) e->inputs_.push_back({e->plan_.value(in).name, e->plan_.type(in)});
  for (ValueId out : e->plan_.outputs()) e->outputs_.push_back({e->plan_.value(out).name, e->plan_.type(out)});
  Assembly a;
  e->choose_kernels(nullptr, a);
  e->options_.background = false;  // how its kernels were made, not how any others will be
  std::ostringstream log;
  log << std::fixed << std::setprecision(1) << "instance of an engine for inputs";
  for (const IOTensor& io : inputs_) log << " " << io.type.to_string();
  log << ", at";
  for (const IOTensor& io : e->inputs_) log << " " << io.type.to_string();
  log << "; optimization level " << options.optimization_level << "\nkernels: " << e->plan_.nodes().size()
      << " made in " << a.kernels_ms << " ms" << e->slowest_kernels(a.kernel_ms) << "memory: arena "
      << e->memory_.arena_bytes << " bytes, constants shared but " << own.size() << " of their own\n";
  e->log_ = log.str();
  return e;
}

void Engine::check_current() const {
  KILN_CHECK(parent_ == nullptr || parent_->weights_version() == parent_version_, kInvalidArgument,
             "this engine is an instance of an engine whose weights changed since (a refit); make the instance again");
}

}  // namespace kiln
