// kiln-run: load a Kiln engine file or bundle, run it on random or given inputs, report latency
// and throughput, and optionally write the outputs as .npy files.
//
//   kiln-run FILE [--inputs a.npy,b.npy] [--shapes NAME:AxBxC,...] [--iterations N] [--warmup N]
//            [--outputs DIR] [--threads N] [--device cpu|cuda:N] [--seed N] [--info]
//
// FILE is an engine file (Engine::save, kiln.extract_engines) or a bundle (kiln.save(...,
// output_format="kiln_bundle"), kiln/bundle.h), told apart by their magic; an engine runs as a
// bundle of one call. A program saved by kiln.save as a torch.export archive is refused with a
// message saying how to save a bundle instead. A bundle of a dynamic program runs at the shapes
// --shapes (or the --inputs files) give, any in its ranges, its engines' instances made for them
// (Bundle::at); inputs not named run at the sizes the program was compiled at.
//
// Random inputs are deterministic (a fixed generator, not the C++ library's distributions,
// so every platform draws the same numbers): floats uniform in [-1, 1], integers in [0, 3],
// bools 0/1. .npy conventions (bf16 as '<u2' raw bits) are in src/serialize/npy.h.
// Exit status: 0 success, 1 runtime error ("kiln-run: error: ..."), 2 usage error.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/bundle.h"
#include "kiln/kiln.h"
#include "src/serialize/engine_file.h"
#include "src/serialize/input_file.h"
#include "src/serialize/npy.h"
#include "tools/random_tensors.h"

namespace {

constexpr const char* kUsage =
    "usage: kiln-run FILE [--inputs a.npy,b.npy] [--shapes NAME:AxBxC,...] [--iterations N] [--warmup N]\n"
    "                [--outputs DIR] [--threads N] [--device cpu|cuda:N] [--seed N] [--info]\n"
    "  FILE          an engine file or a Kiln bundle (kiln.save(..., output_format=\"kiln_bundle\"))\n"
    "  --inputs      one .npy per input, in order (default: random inputs)\n"
    "  --shapes      the shape of each named input (its name or input<i>), e.g. input0:8x3x224x224; a\n"
    "                dynamic program's bundle runs at any shape in its ranges (default: compiled sizes)\n"
    "  --iterations  timed runs (default 100)   --warmup  untimed runs first (default 10)\n"
    "  --outputs     write each output to DIR/out<i>_<name>.npy\n"
    "  --threads     CPU worker threads          --device  default: the engines' backend\n"
    "  --info        print the plans and build logs, then exit\n";

struct UsageError {
  std::string message;
};

struct Options {
  std::string file;
  std::vector<std::string> inputs;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  int64_t iterations = 100, warmup = 10, threads = 0;
  uint64_t seed = 0;
  std::string outputs, device;
  bool info = false;
};

int64_t parse_count(const std::string& flag, const std::string& text, int64_t min) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min)
    throw UsageError{flag + " needs an integer >= " + std::to_string(min) + ", got '" + text + "'"};
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    bool has_value = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_value = true;
    }
    auto take = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    if (a == "--inputs") {
      std::string list = take();
      for (size_t start = 0; start <= list.size();) {
        size_t comma = std::min(list.find(',', start), list.size());
        if (comma == start) throw UsageError{"--inputs has an empty file name in '" + list + "'"};
        o.inputs.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (a == "--shapes") {
      std::string list = take();
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        const size_t colon = item.rfind(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == item.size())
          throw UsageError{"--shapes takes NAME:AxBxC items, got '" + item + "'"};
        std::vector<int64_t> shape;
        const std::string dims = item.substr(colon + 1);
        for (size_t d = 0; d <= dims.size();) {
          const size_t x = std::min(dims.find('x', d), dims.size());
          shape.push_back(parse_count("--shapes", dims.substr(d, x - d), 0));
          d = x + 1;
        }
        o.shapes.emplace_back(item.substr(0, colon), std::move(shape));
        start = comma + 1;
      }
    } else if (a == "--iterations") {
      o.iterations = parse_count(a, take(), 0);
    } else if (a == "--warmup") {
      o.warmup = parse_count(a, take(), 0);
    } else if (a == "--threads") {
      o.threads = parse_count(a, take(), 1);
    } else if (a == "--seed") {
      o.seed = uint64_t(parse_count(a, take(), 0));
    } else if (a == "--outputs") {
      o.outputs = take();
    } else if (a == "--device") {
      o.device = take();
    } else if (a == "--info" && !has_value) {
      o.info = true;
    } else if (a.rfind("-", 0) == 0 && a.size() > 1) {
      throw UsageError{"unknown option '" + args[i] + "'"};
    } else if (o.file.empty()) {
      o.file = a;
    } else {
      throw UsageError{"more than one file given ('" + o.file + "', '" + a + "')"};
    }
  }
  if (o.file.empty()) throw UsageError{"no engine file or bundle given"};
  if (!o.inputs.empty() && !o.shapes.empty()) throw UsageError{"--inputs and --shapes both give the shapes"};
  return o;
}

using kiln::tools::random_tensor;
using kiln::tools::Rng;

std::string file_safe(const std::string& name) {
  std::string s = name.empty() ? "output" : name;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') c = '_';
  return s;
}

std::string describe(const kiln::IOTensor& t) { return t.name + ": " + t.type.to_string(); }

// An engine's inputs, outputs and weights (all with --info, else the first 20).
void print_engine(const kiln::Engine& engine, bool all) {
  const kiln::Graph& g = engine.graph();
  std::printf("inputs:\n");
  for (size_t i = 0; i < engine.inputs().size(); ++i)
    std::printf("  %zu %s\n", i, describe(engine.inputs()[i]).c_str());
  std::printf("outputs:\n");
  for (size_t i = 0; i < engine.outputs().size(); ++i)
    std::printf("  %zu %s\n", i, describe(engine.outputs()[i]).c_str());
  size_t weight_bytes = 0, shown = 0, nweights = 0;
  for (kiln::ValueId c : g.constants()) {
    nweights += g.value(c).is_weight ? 1 : 0;
    weight_bytes += g.value(c).data->size();
  }
  std::printf("weights: %zu (constants %zu bytes in all)\n", nweights, weight_bytes);
  for (kiln::ValueId c : g.constants()) {
    const kiln::Value& v = g.value(c);
    if (!v.is_weight) continue;
    if (!all && shown == 20) {
      std::printf("  ... %zu more (--info lists all)\n", nweights - shown);
      break;
    }
    std::printf("  %s: %s\n", v.name.c_str(), v.type.to_string().c_str());
    ++shown;
  }
}

void print_plan(const kiln::Engine& engine) {
  const kiln::Graph& g = engine.graph();
  std::printf("plan (%zu nodes, arena %zu bytes, workspace %zu bytes):\n%s", g.nodes().size(),
              engine.memory_plan().arena_bytes, engine.workspace_size(), g.to_string().c_str());
  std::printf("build log:\n%s", engine.build_log().c_str());
}

// "args_0" for a program input, "step 1 output 0 'y'" for an engine output.
std::string value_text(const kiln::Bundle& b, const kiln::BundleRef& r) {
  if (r.step < 0) return b.inputs()[r.index].name;
  const kiln::BundleStep& s = b.program().steps[size_t(r.step)];
  return "step " + std::to_string(r.step) + " output " + std::to_string(r.index) + " '" +
         b.engines()[s.engine]->outputs()[r.index].name + "'";
}

void print_bundle(const kiln::Bundle& b, bool all) {
  std::printf("inputs:\n");
  for (size_t i = 0; i < b.inputs().size(); ++i) std::printf("  %zu %s\n", i, describe(b.inputs()[i]).c_str());
  std::printf("outputs:\n");
  for (size_t i = 0; i < b.outputs().size(); ++i)
    std::printf("  %zu %s = %s\n", i, describe(b.outputs()[i]).c_str(),
                value_text(b, b.program().outputs[i].ref).c_str());
  std::printf("steps:\n");
  for (size_t s = 0; s < b.program().steps.size(); ++s) {
    const kiln::BundleStep& step = b.program().steps[s];
    std::string args;
    for (const kiln::BundleRef& a : step.args) args += (args.empty() ? "" : ", ") + value_text(b, a);
    std::printf("  %zu %s: engine %u (%s)\n", s, step.name.c_str(), step.engine, args.c_str());
  }
  for (size_t i = 0; i < b.engines().size(); ++i) {
    std::printf("engine %zu:\n", i);
    print_engine(*b.engines()[i], all);
    if (all) print_plan(*b.engines()[i]);
  }
}

// Names the file in a Kiln error's message, keeping its code.
[[noreturn]] void rethrow_naming(const kiln::Error& e, const std::string& kind, const std::string& path) {
  const std::string what = e.what();  // "[code] cause": keep the cause, name the file
  throw kiln::Error(e.code(), what.substr(what.find("] ") + 2) + " (" + kind + " '" + path + "')");
}

bool has_zip_magic(const uint8_t* p, size_t n) {
  return n >= 4 && p[0] == 'P' && p[1] == 'K' && p[2] == 3 && p[3] == 4;
}

struct Program {
  std::shared_ptr<kiln::Bundle> bundle;
  const char* kind;  // "engine" or "bundle", for messages
};

// Loads an engine file (as a bundle of one call) or a bundle, and prints what it holds.
Program load(const Options& o) {
  const kiln::serialize::InputFile file(o.file, "engine file or bundle");
  const std::unique_ptr<uint8_t[]> bytes = file.read_all();
  const std::optional<kiln::Device> device =
      o.device.empty() ? std::nullopt : std::optional<kiln::Device>(kiln::Device::parse(o.device));
  KILN_CHECK(!has_zip_magic(bytes.get(), file.size()), kInvalidArgument, "'", o.file,
             "' is a zip archive (a program saved by kiln.save as a torch.export program?), which kiln-run cannot "
             "read: save the program with kiln.save(..., output_format=\"kiln_bundle\"), or write its engines out "
             "with kiln.extract_engines");
  if (kiln::Bundle::has_bundle_magic(bytes.get(), file.size())) {
    std::shared_ptr<kiln::Bundle> b;
    try {
      b = kiln::Bundle::deserialize(bytes.get(), file.size(), device);
    } catch (const kiln::Error& e) {
      rethrow_naming(e, "bundle", o.file);
    }
    std::printf("bundle: %s (%zu bytes, Kiln %s, %zu engine%s, %zu step%s, on %s)\n", o.file.c_str(), file.size(),
                b->kiln_version().c_str(), b->engines().size(), b->engines().size() == 1 ? "" : "s",
                b->program().steps.size(), b->program().steps.size() == 1 ? "" : "s", b->device().to_string().c_str());
    print_bundle(*b, o.info);
    return {b, "bundle"};
  }
  std::shared_ptr<kiln::Engine> engine;
  kiln::serialize::EngineFileHeader header;
  try {
    header = kiln::serialize::read_engine_header(bytes.get(), file.size());
    const kiln::Device d = device                     ? *device
                           : header.backend == "cuda" ? kiln::Device{kiln::DeviceType::kCUDA, 0}
                                                      : kiln::Device{};
    engine = kiln::Engine::deserialize(bytes.get(), file.size(), d);
  } catch (const kiln::Error& e) {
    rethrow_naming(e, "engine file", o.file);
  }
  std::printf("engine: %s (%zu bytes, Kiln %s, %s device '%s')\n", o.file.c_str(), file.size(),
              header.kiln_version.c_str(), header.backend.c_str(), header.device_name.c_str());
  print_engine(*engine, o.info);
  if (o.info) print_plan(*engine);
  return {kiln::Bundle::of_engine(std::move(engine)), "engine"};
}

// The input shapes --shapes gives (by name or input<i>), the others as compiled.
std::vector<std::vector<int64_t>> requested_shapes(const kiln::Bundle& b, const Options& o) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& in : b.inputs()) shapes.push_back(in.type.shape());
  for (const auto& [name, shape] : o.shapes) {
    size_t i = 0;
    while (i < b.inputs().size() && b.inputs()[i].name != name && "input" + std::to_string(i) != name) ++i;
    if (i == b.inputs().size()) {
      std::string names;
      for (size_t k = 0; k < b.inputs().size(); ++k)
        names += (k ? ", " : "") + b.inputs()[k].name + " (input" + std::to_string(k) + ")";
      KILN_FAIL(kInvalidArgument, "--shapes names '", name, "', which is no input; the inputs are ", names);
    }
    shapes[i] = shape;
  }
  return shapes;
}

int run(const Options& o) {
  if (o.threads > 0) setenv("KILN_NUM_THREADS", std::to_string(o.threads).c_str(), 1);
  const Program loaded = load(o);
  if (o.info) return 0;

  // Host inputs: given files (checked against the program) or random, of the shapes given.
  std::vector<kiln::npy::Array> files;
  for (const std::string& path : o.inputs) files.push_back(kiln::npy::read_file(path));
  std::vector<std::vector<int64_t>> shapes = requested_shapes(*loaded.bundle, o);
  if (!o.inputs.empty()) {
    KILN_CHECK(o.inputs.size() == shapes.size(), kInvalidArgument, "the ", loaded.kind, " takes ", shapes.size(),
               " inputs, --inputs gives ", o.inputs.size(), " files");
    for (size_t i = 0; i < files.size(); ++i) shapes[i] = files[i].shape;
  }
  const kiln::SymbolBinding binding = loaded.bundle->bind(shapes);
  if (!binding.empty()) {
    std::string text;
    for (const auto& [name, value] : binding) text += (text.empty() ? "" : ", ") + name + "=" + std::to_string(value);
    std::printf("sizes: %s\n", text.c_str());
  }
  const std::shared_ptr<const kiln::Bundle> program = loaded.bundle->at(binding);
  const kiln::Device device = program->device();
  std::vector<kiln::Bytes> host_in;
  const auto& want = program->inputs();
  if (!o.inputs.empty()) {
    for (size_t i = 0; i < want.size(); ++i) {
      kiln::npy::Array& a = files[i];
      kiln::TensorType got(a.dtype, a.shape);
      KILN_CHECK(a.dtype == want[i].type.dtype && a.shape == want[i].type.shape(), kInvalidArgument, "input ", i, " '",
                 want[i].name, "' must be ", want[i].type.to_string(), ", '", o.inputs[i], "' holds ", got.to_string());
      host_in.push_back(std::move(a.data));
    }
  } else {
    for (size_t i = 0; i < want.size(); ++i) {
      Rng rng{o.seed * 1000003u + i};
      host_in.push_back(random_tensor(want[i].type, rng));
    }
  }

  kiln::Backend& be = kiln::get_backend(device);
  std::vector<std::shared_ptr<void>> dev_in, dev_out;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (size_t i = 0; i < want.size(); ++i) {
    dev_in.push_back(be.allocate(host_in[i].size()));
    be.copy_from_host(dev_in.back().get(), host_in[i].data(), host_in[i].size(), nullptr);
    in_ptrs.push_back(dev_in.back().get());
  }
  for (const auto& out : program->outputs()) {
    dev_out.push_back(be.allocate(out.type.nbytes()));
    out_ptrs.push_back(dev_out.back().get());
  }
  be.synchronize(nullptr);

  auto ctx = program->create_context();
  auto once = [&] {
    ctx->execute(in_ptrs, out_ptrs, nullptr);
    be.synchronize(nullptr);
  };
  int64_t warmup = o.warmup;
  if (o.iterations == 0 && warmup == 0 && !o.outputs.empty()) warmup = 1;  // outputs need one run
  for (int64_t i = 0; i < warmup; ++i) once();
  std::vector<double> ms;
  for (int64_t i = 0; i < o.iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    once();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("ran on %s: %lld warmup + %lld timed runs, %s inputs\n", device.to_string().c_str(),
              static_cast<long long>(warmup), static_cast<long long>(o.iterations),
              o.inputs.empty() ? "random" : "given");
  if (!ms.empty()) {
    double total = 0;
    for (double t : ms) total += t;
    std::sort(ms.begin(), ms.end());
    size_t n = ms.size();
    double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    double p90 = ms[(n * 9 + 9) / 10 - 1];  // nearest rank: ceil(0.9 n)
    std::printf("latency: median %.4f ms, p90 %.4f ms, min %.4f ms, mean %.4f ms\n", median, p90, ms.front(),
                total / double(n));
    std::printf("throughput: %.2f inferences/s\n", total > 0 ? 1000.0 * double(n) / total : 0.0);
  }

  if (!o.outputs.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.outputs, ec);
    KILN_CHECK(!ec, kIo, "cannot create output directory '", o.outputs, "': ", ec.message());
    for (size_t i = 0; i < program->outputs().size(); ++i) {
      const auto& out = program->outputs()[i];
      kiln::Bytes host(out.type.nbytes());
      be.copy_to_host(host.data(), dev_out[i].get(), host.size(), nullptr);
      be.synchronize(nullptr);
      std::string path =
          (std::filesystem::path(o.outputs) / ("out" + std::to_string(i) + "_" + file_safe(out.name) + ".npy"))
              .string();
      kiln::npy::write_file(path, out.type.dtype, out.type.shape(), host.data(), host.size());
      std::printf("wrote %s\n", path.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
    o = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kiln-run: error: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-run: error: %s\n", e.what());
    return 1;
  }
}
