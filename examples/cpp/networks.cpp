// Builds two small networks with the C++ API alone, builds engines and saves them, together
// with their weights and a random input as .npy files, so that another process (kiln-run,
// or a PyTorch script that loads the same weights) can check them:
//
//   convnet:      conv3x3 -> batch_norm -> relu -> max_pool -> conv3x3 -> relu
//                 -> adaptive_avg_pool -> flatten -> linear
//   transformer:  one post-norm encoder block (multi-head self-attention, GELU MLP) as
//                 nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
//                 activation="gelu", batch_first=True) computes it in eval mode.
//
//   kiln-networks OUT_DIR
//
// writes OUT_DIR/<net>.kiln, OUT_DIR/<net>.input.npy and OUT_DIR/<net>.<weight>.npy.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "src/serialize/npy.h"

namespace {

using kiln::Attrs;
using kiln::DType;
using kiln::Graph;
using kiln::OpKind;
using kiln::TensorType;
using kiln::ValueId;

class NetBuilder {
 public:
  NetBuilder(std::string dir, std::string net) : dir_(std::move(dir)), net_(std::move(net)), rng_(42) {}

  // A named weight with N(0, scale) values, saved next to the engine for the reference.
  ValueId weight(const std::string& name, const std::vector<int64_t>& shape, float scale, float shift = 0.f) {
    TensorType t(DType::kF32, shape);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::normal_distribution<float> dist(0.f, scale);
    for (float& x : v) x = dist(rng_) + shift;
    save(net_ + "." + name, shape, v);
    return g.add_constant(name, t, v.data(), v.size() * sizeof(float), /*weight=*/true);
  }
  ValueId positive_weight(const std::string& name, const std::vector<int64_t>& shape) {
    TensorType t(DType::kF32, shape);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (float& x : v) x = dist(rng_);
    save(net_ + "." + name, shape, v);
    return g.add_constant(name, t, v.data(), v.size() * sizeof(float), /*weight=*/true);
  }
  ValueId input(const std::vector<int64_t>& shape) {
    std::vector<float> v(static_cast<size_t>(TensorType(DType::kF32, shape).numel()));
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (float& x : v) x = dist(rng_);
    save(net_ + ".input", shape, v);
    return g.add_input("x", TensorType(DType::kF32, shape));
  }
  ValueId op(OpKind k, std::vector<ValueId> in, Attrs a = {}) { return g.add_node1(k, in, a); }

  void finish(ValueId out) {
    g.mark_output(out, "y");
    kiln::BuilderConfig cfg;
    auto engine = kiln::Builder(cfg).build(g);
    std::string path = dir_ + "/" + net_ + ".kiln";
    engine->save(path);
    std::printf("%s: %zu network nodes -> %zu engine nodes, arena %zu bytes (naive %zu), saved %s\n",
                net_.c_str(), g.nodes().size(), engine->graph().nodes().size(), engine->memory_plan().arena_bytes,
                engine->memory_plan().naive_bytes, path.c_str());
  }

  Graph g;

 private:
  void save(const std::string& stem, const std::vector<int64_t>& shape, const std::vector<float>& v) {
    kiln::npy::write_file(dir_ + "/" + stem + ".npy", DType::kF32, shape, v.data(), v.size() * sizeof(float));
  }
  std::string dir_, net_;
  std::mt19937 rng_;
};

Attrs ints(std::initializer_list<std::pair<const char*, std::vector<int64_t>>> kv) {
  Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

void build_convnet(const std::string& dir) {
  NetBuilder b(dir, "convnet");
  ValueId x = b.input({2, 3, 16, 16});
  Attrs conv = ints({{"stride", {1, 1}}, {"padding", {1, 1}}, {"dilation", {1, 1}}});
  conv.set("groups", int64_t{1});
  ValueId h = b.op(OpKind::kConv, {x, b.weight("conv1.weight", {8, 3, 3, 3}, 0.3f), b.weight("conv1.bias", {8}, 0.1f)}, conv);
  Attrs bn;
  bn.set("eps", 1e-5);
  h = b.op(OpKind::kBatchNorm, {h, b.weight("bn1.running_mean", {8}, 0.1f), b.positive_weight("bn1.running_var", {8}),
                                b.weight("bn1.weight", {8}, 0.2f, 1.f), b.weight("bn1.bias", {8}, 0.1f)}, bn);
  h = b.op(OpKind::kRelu, {h});
  Attrs pool = ints({{"kernel", {2, 2}}, {"stride", {2, 2}}, {"padding", {0, 0}}, {"dilation", {1, 1}}});
  pool.set("ceil_mode", false);
  h = b.op(OpKind::kMaxPool, {h}, pool);
  h = b.op(OpKind::kConv, {h, b.weight("conv2.weight", {16, 8, 3, 3}, 0.2f), b.weight("conv2.bias", {16}, 0.1f)}, conv);
  h = b.op(OpKind::kRelu, {h});
  h = b.op(OpKind::kAdaptiveAvgPool, {h}, ints({{"output_size", {1, 1}}}));
  h = b.op(OpKind::kReshape, {h}, ints({{"shape", {2, 16}}}));
  h = b.op(OpKind::kLinear, {h, b.weight("fc.weight", {10, 16}, 0.3f), b.weight("fc.bias", {10}, 0.1f)});
  b.finish(h);
}

void build_transformer(const std::string& dir) {
  const int64_t B = 2, L = 10, D = 32, H = 4, F = 64, E = D / H;
  NetBuilder b(dir, "transformer");
  ValueId x = b.input({B, L, D});
  auto linear = [&](ValueId in, const std::string& name, int64_t out, int64_t inner) {
    return b.op(OpKind::kLinear, {in, b.weight(name + ".weight", {out, inner}, 0.15f), b.weight(name + ".bias", {out}, 0.05f)});
  };
  auto layer_norm = [&](ValueId in, const std::string& name) {
    Attrs a;
    a.set("normalized_rank", int64_t{1});
    a.set("eps", 1e-5);
    return b.op(OpKind::kLayerNorm, {in, b.weight(name + ".weight", {D}, 0.1f, 1.f), b.weight(name + ".bias", {D}, 0.1f)}, a);
  };
  ValueId qkv = linear(x, "self_attn.in_proj", 3 * D, D);  // [B, L, 3D]
  Attrs split;
  split.set("axis", int64_t{2});
  split.set("sizes", std::vector<int64_t>{D, D, D});
  auto parts = b.g.add_node(OpKind::kSplit, {qkv}, split);
  auto heads = [&](ValueId t) {  // [B, L, D] -> [B, H, L, E]
    t = b.op(OpKind::kReshape, {t}, ints({{"shape", {B, L, H, E}}}));
    return b.op(OpKind::kPermute, {t}, ints({{"perm", {0, 2, 1, 3}}}));
  };
  Attrs sdpa;
  sdpa.set("causal", false);
  ValueId att = b.op(OpKind::kSdpa, {heads(parts[0]), heads(parts[1]), heads(parts[2])}, sdpa);
  att = b.op(OpKind::kPermute, {att}, ints({{"perm", {0, 2, 1, 3}}}));
  att = b.op(OpKind::kReshape, {att}, ints({{"shape", {B, L, D}}}));
  att = linear(att, "self_attn.out_proj", D, D);
  ValueId h = layer_norm(b.op(OpKind::kAdd, {x, att}), "norm1");
  Attrs gelu;
  gelu.set("approximate", std::string("none"));
  ValueId ff = b.op(OpKind::kGelu, {linear(h, "linear1", F, D)}, gelu);
  ff = linear(ff, "linear2", D, F);
  b.finish(layer_norm(b.op(OpKind::kAdd, {h, ff}), "norm2"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln-networks OUT_DIR\n");
    return 2;
  }
  try {
    std::filesystem::create_directories(argv[1]);
    build_convnet(argv[1]);
    build_transformer(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-networks: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
