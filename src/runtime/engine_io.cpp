// Engine::serialize / deserialize / save / load: engine files on top of src/serialize/.
//
// A loaded engine is made on the load path (Engine::restore on the rebuilt plan: the kernels
// chosen at build made again from their saved states, by the loading backend); the file records
// which backend and device built it, and loading elsewhere is refused (kDeviceMismatch) rather
// than silently retuned.
// save() writes a temporary file next to the target and renames it over the target, so a
// reader never sees a half-written engine. load_mapped() keeps the file mapped and its
// constants are views of the mapping (no copy of the weights). Both open the file through
// serialize::InputFile: a regular file of bounded size, never a FIFO or device that could block.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "kiln/engine.h"
#include "kiln/errors.h"
#include "src/common/stopwatch.h"
#include "src/serialize/engine_file.h"
#include "src/serialize/input_file.h"

namespace kiln {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void io_fail(const char* what, const std::string& path, int err) {
  KILN_FAIL(kIo, "cannot ", what, " engine file '", path, "': ", std::strerror(err));
}

// Runs `load` and names the file in the message of any Kiln error it throws.
template <typename Load>
std::shared_ptr<Engine> naming_file(const std::string& path, Load&& load) {
  try {
    return load();
  } catch (const Error& e) {
    throw Error(e.code(),
                std::string(e.what()).substr(std::strlen(error_code_name(e.code())) + 3) + " (file '" + path + "')");
  }
}

}  // namespace

Bytes Engine::serialize() const { return serialize_with_kernels_of(*this); }

Bytes Engine::serialize_with_kernels_of(const Engine& kernels) const {
  if (&kernels != this) {
    KILN_CHECK(kernels.parent_.get() == this, kInvalidArgument,
               "serialize: the kernels are not those of an instance of this engine");
    bool same =
        kernels.plan_.num_values() == plan_.num_values() && kernels.plan_.nodes().size() == plan_.nodes().size();
    for (ValueId v = 0; same && v < plan_.num_values(); ++v) same = kernels.plan_.type(v) == plan_.type(v);
    KILN_CHECK(same, kInvalidArgument, "serialize: the kernels are those of an instance at other sizes");
  }
  serialize::EngineFile f;
  f.kiln_version = kKilnVersion;
  f.backend = backend_->name();
  f.device_name = backend_->device_name();
  f.plan = plan_;
  f.options = options_;
  f.options.optimization_level = kernels.options_.optimization_level;
  f.build_log = log_;
  bool any_state = false;
  for (const Bytes& b : kernels.kernel_states_) any_state = any_state || !b.empty();
  if (any_state) f.kernel_states = kernels.kernel_states_;
  f.refit_program = refit_program_;
  f.source_weights_id = source_weights_id_;
  return serialize::write_engine_file(f);
}

std::shared_ptr<Engine> Engine::deserialize(const uint8_t* data, size_t size, const Device& device) {
  return from_file_bytes(data, size, device, nullptr);
}

std::shared_ptr<Engine> Engine::from_file_bytes(const uint8_t* data, size_t size, const Device& device,
                                                std::shared_ptr<void> owner) {
  Backend& be = get_backend(device);
  std::future<std::string> libraries = be.warm_up();  // overlaps the read and the upload
  const Stopwatch read_watch;
  serialize::EngineFile f = serialize::read_engine_file(data, size, be.name(), be.device_name(), owner);
  const double read_ms = read_watch.ms();
  std::string log = f.build_log + "loaded from an engine file (" + std::to_string(size) + " bytes, written by Kiln " +
                    f.kiln_version + (owner ? ", mapped" : "") + ", read in " + std::to_string(int64_t(read_ms)) +
                    " ms)\n";
  std::shared_ptr<Engine> e =
      restore(std::move(f.plan), device, f.options, std::move(log), f.kernel_states, std::move(f.refit_program));
  e->source_weights_id_ = std::move(f.source_weights_id);
  if (libraries.valid()) e->log_ += "libraries set up while loading: " + libraries.get() + "\n";
  return e;
}

void Engine::save(const std::string& path) const {
  KILN_CHECK(!path.empty(), kInvalidArgument, "Engine::save needs a path");
  Bytes bytes = serialize();
  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) io_fail("write", tmp, errno);
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size() && std::fflush(f.get()) == 0;
    int err = errno;
    int closed = std::fclose(f.release());
    if (!ok || closed != 0) {
      if (ok) err = errno;
      std::remove(tmp.c_str());
      io_fail("write", tmp, err);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    io_fail("write", path, err);
  }
}

std::shared_ptr<Engine> Engine::load(const std::string& path, const Device& device) {
  const serialize::InputFile file(path, "engine file");
  const std::unique_ptr<uint8_t[]> bytes = file.read_all();
  return naming_file(path, [&] { return deserialize(bytes.get(), file.size(), device); });
}

std::shared_ptr<Engine> Engine::load_mapped(const std::string& path, const Device& device) {
  const serialize::InputFile file(path, "engine file");
  const size_t size = file.size();
  if (size == 0)  // mmap cannot map an empty file; the reader names what is wrong with it
    return naming_file(path, [&] { return deserialize(nullptr, 0, device); });
  // Private and writable: a refit writes the engine's weights, and those pages become the
  // process's own copies; the file never changes.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED) file.fail("map", errno);
  std::shared_ptr<void> mapping(p, [size](void* q) { ::munmap(q, size); });  // outlives the descriptor
  return naming_file(path, [&] { return from_file_bytes(static_cast<const uint8_t*>(p), size, device, mapping); });
}

}  // namespace kiln
