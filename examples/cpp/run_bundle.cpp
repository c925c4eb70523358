// Runs a Kiln bundle from C++ alone: a model compiled and saved in Python with
//
//   kiln.save(kiln.compile(model, [x]), "model.kiln", [x], output_format="kiln_bundle")
//
// deployed without Python. It builds against the installed package (examples/cpp/CMakeLists.txt:
// find_package(Kiln), Kiln::kiln) and uses only the public headers.
//
//   run_bundle MODEL.kiln [IN_DIR OUT_DIR]
//
// With IN_DIR and OUT_DIR it reads input <i> from IN_DIR/input<i>.bin (the raw bytes of the input's
// dtype, C order, as numpy's tofile() writes them) and writes output <i> to OUT_DIR/output<i>.bin;
// without them it runs on zeros. It prints the program's inputs and outputs either way.
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln/bundle.h"
#include "kiln/errors.h"

namespace {

kiln::Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw kiln::Error(kiln::ErrorCode::kIo, "cannot read '" + path + "'");
  return kiln::Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const kiln::Bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  if (!out) throw kiln::Error(kiln::ErrorCode::kIo, "cannot write '" + path + "'");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: run_bundle MODEL.kiln [IN_DIR OUT_DIR]\n");
    return 2;
  }
  try {
    // The engines load on the device they were built for (a CPU or CUDA device 0).
    const std::shared_ptr<kiln::Bundle> bundle = kiln::Bundle::load(argv[1]);
    std::printf("%s: %zu engine(s) on %s\n", argv[1], bundle->engines().size(), bundle->device().to_string().c_str());
    std::vector<kiln::Bytes> inputs;
    for (size_t i = 0; i < bundle->inputs().size(); ++i) {
      const kiln::IOTensor& in = bundle->inputs()[i];
      std::printf("  input %zu %s: %s\n", i, in.name.c_str(), in.type.to_string().c_str());
      inputs.push_back(argc == 4 ? read_file(std::string(argv[2]) + "/input" + std::to_string(i) + ".bin")
                                 : kiln::Bytes(in.type.nbytes(), 0));
    }
    // One context serves every call (its buffers are allocated once); run() copies host bytes in
    // and out, execute() takes device buffers.
    const std::unique_ptr<kiln::BundleContext> context = bundle->create_context();
    const std::vector<kiln::Bytes> outputs = context->run(inputs);
    for (size_t i = 0; i < outputs.size(); ++i) {
      const kiln::IOTensor& out = bundle->outputs()[i];
      std::printf("  output %zu %s: %s\n", i, out.name.c_str(), out.type.to_string().c_str());
      if (argc == 4) write_file(std::string(argv[3]) + "/output" + std::to_string(i) + ".bin", outputs[i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_bundle: %s\n", e.what());
    return 1;
  }
  return 0;
}
