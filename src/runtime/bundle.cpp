// Bundle and BundleContext (kiln/bundle.h): loading a bundle's engines, checking its glue, and
// running the engine calls in order with the values routed between them.
#include <algorithm>
#include <cstring>
#include <utility>

#include "kiln/bundle.h"
#include "kiln/errors.h"
#include "src/runtime/bundle_file.h"
#include "src/serialize/engine_file.h"
#include "src/serialize/input_file.h"

namespace kiln {

namespace {

// The message of `e` without its "[code] " prefix.
std::string message_of(const Error& e) {
  std::string s = e.what();
  const size_t close = s.find("] ");
  return (!s.empty() && s[0] == '[' && close != std::string::npos) ? s.substr(close + 2) : s;
}

// The steps that call engine `i`, for messages ("step 0 ('gm._kiln_engine_0')").
std::string callers_of(const BundleProgram& p, size_t i) {
  std::string s;
  for (size_t k = 0; k < p.steps.size(); ++k)
    if (p.steps[k].engine == i) s += (s.empty() ? "" : ", ") + detail::concat("step ", k, " ('", p.steps[k].name, "')");
  return s.empty() ? "called by no step" : "called by " + s;
}

// The device an engine file's backend runs on, device 0.
Device device_for(std::span<const uint8_t> engine) {
  const serialize::EngineFileHeader h = serialize::read_engine_header(engine.data(), engine.size());
  if (h.backend == "cpu") return Device{};
  if (h.backend == "cuda") return Device{DeviceType::kCUDA, 0};
  KILN_FAIL(kDeviceMismatch, "engine file was built for backend '", h.backend, "', which this Kiln does not have");
}

}  // namespace

Bytes write_bundle(const std::vector<std::span<const uint8_t>>& engine_files, const BundleProgram& program) {
  std::vector<bundle_file::EngineIO> io(engine_files.size());
  for (size_t i = 0; i < engine_files.size(); ++i) {
    const auto& bytes = engine_files[i];
    try {
      // Only the plan is needed: the constants stay views of the caller's bytes (an owner that
      // owns nothing), and no backend is asked for anything.
      const serialize::EngineFileHeader h = serialize::read_engine_header(bytes.data(), bytes.size());
      const std::shared_ptr<void> views(std::shared_ptr<void>(), const_cast<uint8_t*>(bytes.data()));
      const serialize::EngineFile f =
          serialize::read_engine_file(bytes.data(), bytes.size(), h.backend, h.device_name, views);
      for (ValueId v : f.plan.inputs()) io[i].inputs.push_back({f.plan.value(v).name, f.plan.type(v)});
      for (ValueId v : f.plan.outputs()) io[i].outputs.push_back({f.plan.value(v).name, f.plan.type(v)});
    } catch (const Error& e) {
      throw Error(e.code(), detail::concat("cannot write the bundle: engine ", i, " (", callers_of(program, i),
                                           "): ", message_of(e)));
    }
  }
  const std::string problem = bundle_file::program_problem(program, io, nullptr);
  KILN_CHECK(problem.empty(), kInvalidArgument, "cannot write the bundle: ", problem);
  return bundle_file::write(kKilnVersion, program, engine_files);
}

// ---- Bundle ----------------------------------------------------------------------------

bool Bundle::has_bundle_magic(const uint8_t* data, size_t size) {
  return data && size >= sizeof bundle_file::kMagic &&
         std::memcmp(data, bundle_file::kMagic, sizeof bundle_file::kMagic) == 0;
}

std::shared_ptr<Bundle> Bundle::deserialize(const uint8_t* data, size_t size, const std::optional<Device>& device) {
  bundle_file::BundleFile f = bundle_file::read(data, size);
  KILN_CHECK(!f.engines.empty(), kCorrupted, "bundle corrupted: it holds no engine");
  std::shared_ptr<Bundle> b(new Bundle());
  b->program_ = std::move(f.program);
  b->kiln_version_ = std::move(f.kiln_version);
  for (size_t i = 0; i < f.engines.size(); ++i) {
    try {
      if (i == 0) b->device_ = device ? *device : device_for(f.engines[0]);
      b->engines_.push_back(Engine::deserialize(f.engines[i].data(), f.engines[i].size(), b->device_));
    } catch (const Error& e) {
      throw Error(e.code(), detail::concat("bundle engine ", i, " of ", f.engines.size(), " (",
                                           callers_of(b->program_, i), "): ", message_of(e)));
    }
  }
  b->finish();
  return b;
}

std::shared_ptr<Bundle> Bundle::load(const std::string& path, const std::optional<Device>& device) {
  const serialize::InputFile file(path, "bundle");
  const std::unique_ptr<uint8_t[]> bytes = file.read_all();
  try {
    return deserialize(bytes.get(), file.size(), device);
  } catch (const Error& e) {
    throw Error(e.code(), message_of(e) + " (file '" + path + "')");
  }
}

std::shared_ptr<Bundle> Bundle::of_engine(std::shared_ptr<Engine> engine) {
  KILN_CHECK(engine != nullptr, kInvalidArgument, "Bundle::of_engine needs an engine");
  std::shared_ptr<Bundle> b(new Bundle());
  BundleStep step{"engine", 0, {}};
  for (uint32_t i = 0; i < engine->inputs().size(); ++i) {
    b->program_.inputs.push_back(
        {engine->inputs()[i].name, TensorType(engine->inputs()[i].type.dtype, engine->inputs()[i].type.shape())});
    step.args.push_back({-1, i});
  }
  for (uint32_t i = 0; i < engine->outputs().size(); ++i)
    b->program_.outputs.push_back({engine->outputs()[i].name,
                                   {0, i},
                                   TensorType(engine->outputs()[i].type.dtype, engine->outputs()[i].type.shape())});
  b->program_.steps.push_back(std::move(step));
  b->device_ = engine->device();
  b->engines_.push_back(std::move(engine));
  b->finish();
  return b;
}

bool Bundle::dynamic() const {
  for (const IOTensor& in : program_.inputs)
    for (const Dim& d : in.type.dims)
      if (!d.is_static()) return true;
  return !program_.ranges.empty();
}

SymbolBinding Bundle::bind(const std::vector<std::vector<int64_t>>& shapes) const {
  const auto& ins = program_.inputs;
  KILN_CHECK(shapes.size() == ins.size(), kInvalidArgument, "the bundle takes ", ins.size(), " inputs, got ",
             shapes.size(), " shapes");
  SymbolBinding b;
  for (size_t i = 0; i < ins.size(); ++i) {
    const TensorType& t = ins[i].type;
    const std::vector<int64_t>& s = shapes[i];
    const std::string where = detail::concat("input ", i, " '", ins[i].name, "'");
    KILN_CHECK(s.size() == t.dims.size(), kInvalidArgument, where, " has rank ", t.rank(), ", got the shape ",
               TensorType(t.dtype, s).to_string());
    for (size_t d = 0; d < s.size(); ++d) {
      const Dim& dim = t.dims[d];
      if (dim.is_static()) {
        KILN_CHECK(s[d] == dim.extent, kShapeMismatch, where, " dim ", d, " is ", s[d], "; the bundle takes ",
                   dim.extent, " there (a static dim)");
        continue;
      }
      KILN_CHECK(s[d] >= dim.min && s[d] <= dim.max, kShapeMismatch, where, " dim ", d, " (", dim.symbol, ") is ", s[d],
                 ", outside its range [", dim.min, ", ", dim.max, "]");
      const auto [it, fresh] = b.emplace(dim.symbol, s[d]);
      KILN_CHECK(fresh || it->second == s[d], kShapeMismatch, where, " dim ", d, " (", dim.symbol, ") is ", s[d],
                 ", an earlier input gave ", dim.symbol, " = ", it->second);
    }
  }
  return b;
}

std::shared_ptr<const Bundle> Bundle::at(const SymbolBinding& binding) const {
  if (!dynamic()) return shared_from_this();
  std::string text;
  for (const auto& [name, value] : binding) text += detail::concat(text.empty() ? "" : ", ", name, "=", value);
  std::shared_ptr<Bundle> b(new Bundle());
  b->device_ = device_;
  b->kiln_version_ = kiln_version_;
  b->program_.steps = program_.steps;
  for (const IOTensor& in : program_.inputs) {
    std::vector<int64_t> shape;
    for (const Dim& d : in.type.dims) {
      if (d.is_static()) {
        shape.push_back(d.extent);
        continue;
      }
      const auto it = binding.find(d.symbol);
      KILN_CHECK(it != binding.end(), kInvalidArgument, "Bundle::at: the binding (", text, ") lacks ", d.symbol,
                 ", a dim of input '", in.name, "'");
      KILN_CHECK(it->second >= d.min && it->second <= d.max, kShapeMismatch, "Bundle::at: ", d.symbol, " = ",
                 it->second, " is outside its range [", d.min, ", ", d.max, "] (input '", in.name, "')");
      shape.push_back(it->second);
    }
    b->program_.inputs.push_back({in.name, TensorType(in.type.dtype, shape)});
  }
  b->engines_ = engines_;
  for (const BundleRange& r : program_.ranges) {
    const std::string which = detail::concat("bundle engine ", r.engine, " (", callers_of(program_, r.engine), ")");
    for (const auto& [name, value] : r.pinned) {
      const auto it = binding.find(name);
      KILN_CHECK(it != binding.end() && it->second == value, kUnsupported, which, " serves ", name, " = ", value,
                 " only (its plan holds it there), not ", text);
    }
    SymbolBinding sub;
    for (const std::string& name : r.program.symbols()) {
      const auto it = binding.find(name);
      KILN_CHECK(it != binding.end(), kInvalidArgument, "Bundle::at: the binding (", text, ") lacks ", name);
      sub[name] = it->second;
    }
    if (sub == r.built_at) continue;
    const Engine& e = *engines_[r.engine];
    KernelOptions options = e.kernel_options();
    options.optimization_level = 0;  // made now, untimed, as a new size of a dynamic program is
    options.precompiled_only = true;
    try {
      b->engines_[r.engine] = e.instance(r.program.evaluate(e.graph(), sub), options);
    } catch (const Error& err) {
      throw Error(err.code(), detail::concat(which, " at ", text, ": ", message_of(err)));
    }
  }
  for (const BundleOutput& o : program_.outputs) {
    const TensorType& t = o.ref.step < 0
                              ? b->program_.inputs[o.ref.index].type
                              : b->engines_[program_.steps[size_t(o.ref.step)].engine]->outputs()[o.ref.index].type;
    b->program_.outputs.push_back({o.name, o.ref, TensorType(t.dtype, t.shape())});
  }
  b->finish();
  return b;
}

void Bundle::finish() {
  std::vector<bundle_file::EngineIO> io;
  for (const auto& e : engines_) io.push_back({e->inputs(), e->outputs()});
  const std::string problem = bundle_file::program_problem(program_, io, &outputs_);
  KILN_CHECK(problem.empty(), kCorrupted, "bundle corrupted: ", problem);
}

std::unique_ptr<BundleContext> Bundle::create_context(bool use_graphs) const {
  if (dynamic()) {  // at the sizes it was compiled at
    std::vector<std::vector<int64_t>> shapes;
    for (const IOTensor& in : program_.inputs) shapes.push_back(in.type.shape());
    return at(bind(shapes))->create_context(use_graphs);
  }
  return std::make_unique<BundleContext>(shared_from_this(), use_graphs);
}

std::vector<Bytes> Bundle::run(const std::vector<Bytes>& inputs) const { return create_context()->run(inputs); }

// ---- BundleContext ---------------------------------------------------------------------

BundleContext::BundleContext(std::shared_ptr<const Bundle> bundle, bool use_graphs) : bundle_(std::move(bundle)) {
  const Bundle& b = *bundle_;
  KILN_CHECK(!b.dynamic(), kInvalidArgument,
             "a dynamic bundle runs at one binding of its symbols: Bundle::at(binding)->create_context()");
  const BundleProgram& p = b.program();
  backend_ = &get_backend(b.device());
  // Each step output goes into the first program output that names it, else a buffer of ours.
  std::vector<bool> taken(p.outputs.size(), false);
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Engine& e = *b.engines()[p.steps[s].engine];
    calls_.push_back(e.create_execution_context(use_graphs));
    std::vector<Place>& places = step_places_.emplace_back();
    for (uint32_t k = 0; k < e.outputs().size(); ++k) {
      const BundleRef ref{int32_t(s), k};
      Place place{Place::kBuffer, buffers_.size()};
      for (size_t o = 0; o < p.outputs.size(); ++o)
        if (p.outputs[o].ref == ref) {
          place = {Place::kOutput, o};
          taken[o] = true;
          break;
        }
      if (place.kind == Place::kBuffer)
        buffers_.push_back(backend_->allocate(std::max<size_t>(e.outputs()[k].type.nbytes(), 1)));
      places.push_back(place);
    }
  }
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    if (taken[o]) continue;
    const BundleRef& r = p.outputs[o].ref;
    const Place from = r.step < 0 ? Place{Place::kInput, r.index} : step_places_[size_t(r.step)][r.index];
    copies_.push_back({o, from, b.outputs()[o].type.nbytes()});
  }
}

const void* BundleContext::address(const Place& p, const std::vector<const void*>& in,
                                   const std::vector<void*>& out) const {
  switch (p.kind) {
    case Place::kInput: return in[p.index];
    case Place::kOutput: return out[p.index];
    case Place::kBuffer: break;
  }
  return buffers_[p.index].get();
}

void BundleContext::execute(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, void* stream) {
  const Bundle& b = *bundle_;
  const BundleProgram& p = b.program();
  KILN_CHECK(inputs.size() == p.inputs.size(), kInvalidArgument, "the bundle takes ", p.inputs.size(), " inputs, got ",
             inputs.size());
  KILN_CHECK(outputs.size() == p.outputs.size(), kInvalidArgument, "the bundle gives ", p.outputs.size(),
             " outputs, got ", outputs.size(), " output buffers");
  for (size_t s = 0; s < p.steps.size(); ++s) {
    in_scratch_.clear();
    out_scratch_.clear();
    for (const BundleRef& a : p.steps[s].args)
      in_scratch_.push_back(a.step < 0 ? inputs[a.index]
                                       : address(step_places_[size_t(a.step)][a.index], inputs, outputs));
    for (const Place& place : step_places_[s])
      out_scratch_.push_back(const_cast<void*>(address(place, inputs, outputs)));
    try {
      calls_[s]->execute(in_scratch_, out_scratch_, stream);
    } catch (const Error& e) {
      throw Error(e.code(), detail::concat("bundle step ", s, " ('", p.steps[s].name, "'): ", message_of(e)));
    }
  }
  for (const Copy& c : copies_)
    if (c.bytes) backend_->copy_on_device(outputs[c.output], address(c.from, inputs, outputs), c.bytes, stream);
}

std::vector<Bytes> BundleContext::run(const std::vector<Bytes>& inputs) {
  const Bundle& b = *bundle_;
  KILN_CHECK(inputs.size() == b.inputs().size(), kInvalidArgument, "the bundle takes ", b.inputs().size(),
             " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(inputs[i].size() == b.inputs()[i].type.nbytes(), kInvalidArgument, "bundle input ", i, " '",
               b.inputs()[i].name, "' (", b.inputs()[i].type.to_string(), ") takes ", b.inputs()[i].type.nbytes(),
               " bytes, got ", inputs[i].size());
  std::vector<Bytes> results;
  for (const IOTensor& o : b.outputs()) results.emplace_back(o.type.nbytes());
  std::vector<const void*> in;
  std::vector<void*> out;
  if (b.device().type == DeviceType::kCPU) {
    for (const Bytes& x : inputs) in.push_back(x.data());
    for (Bytes& y : results) out.push_back(y.data());
    execute(in, out);
    return results;
  }
  std::vector<std::shared_ptr<void>> device;
  for (const Bytes& x : inputs) {
    device.push_back(backend_->allocate(std::max<size_t>(x.size(), 1)));
    backend_->copy_from_host(device.back().get(), x.data(), x.size(), nullptr);
    in.push_back(device.back().get());
  }
  for (const Bytes& y : results) {
    device.push_back(backend_->allocate(std::max<size_t>(y.size(), 1)));
    out.push_back(device.back().get());
  }
  execute(in, out);
  for (size_t o = 0; o < results.size(); ++o)
    backend_->copy_to_host(results[o].data(), out[o], results[o].size(), nullptr);
  backend_->synchronize(nullptr);
  return results;
}

}  // namespace kiln
