// Refit (include/kiln/refit.h): the refit program the builder records while folding, and the
// Refitter. The reference for every refit is a fresh build of the same network with the new
// weights: a refitted engine must hold bit-identical constants and compute bit-identical
// outputs on the CPU. Also: wrong names / shapes / dtypes, weights needed together, immutable
// engines, contexts created before a refit, serialize() after a refit, the RFIT section's round
// trip and damaged RFIT sections.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include <unistd.h>

#include "kiln/kiln.h"
#include "kiln/refit.h"
#include "tests/cpp/engine_file_test_util.h"
#include "tests/cpp/error_test_util.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using kiln::test::code_of;
using kiln::test::conv2d_attrs;
using kiln::test::random_floats;
using Shape = std::vector<int64_t>;
using Floats = std::vector<float>;
using Weights = std::map<std::string, Floats>;
namespace eft = kiln::engine_file_test;

// Every weight of a network: name -> shape, and random values for them.
struct WeightSpec {
  std::string name;
  Shape shape;
  float lo = -1.0f, hi = 1.0f;  // variances stay positive
};

Weights random_weights(const std::vector<WeightSpec>& specs, uint32_t seed) {
  Weights w;
  for (const auto& s : specs) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= size_t(d);
    w[s.name] = random_floats(n, seed++, s.lo, s.hi);
  }
  return w;
}

struct Net {
  std::vector<WeightSpec> specs;
  Graph (*make)(const Weights&);
};

ValueId add_weight(Graph& g, const Weights& w, const std::string& name, const Shape& shape) {
  const Floats& v = w.at(name);
  return g.add_constant(name, TensorType(DType::kF32, shape), v.data(), v.size() * 4, true);
}

ValueId batch_norm(Graph& g, const Weights& w, ValueId x, const std::string& p, int64_t c) {
  Attrs a;
  a.set("eps", 1e-5);
  return g.add_node1(OpKind::kBatchNorm,
                     {x, add_weight(g, w, p + ".running_mean", {c}), add_weight(g, w, p + ".running_var", {c}),
                      add_weight(g, w, p + ".weight", {c}), add_weight(g, w, p + ".bias", {c})},
                     a);
}

std::vector<WeightSpec> bn_specs(const std::string& p, int64_t c) {
  return {{p + ".running_mean", {c}}, {p + ".running_var", {c}, 0.5f, 2.0f}, {p + ".weight", {c}}, {p + ".bias", {c}}};
}

// conv+bn+relu -> grouped conv_transpose+bn -> flatten -> linear+bn -> linear whose weight is
// rounded to f16 and back (casts on a weight) with a bias that stays a plan weight.
const Net& conv_net() {
  static const Net net = [] {
    Net n;
    n.specs = {{"conv.weight", {4, 3, 3, 3}}, {"conv.bias", {4}}, {"up.weight", {4, 3, 2, 2}}, {"up.bias", {6}},
               {"fc1.weight", {5, 6 * 4 * 4}}, {"fc2.weight", {3, 5}}, {"fc2.bias", {3}}};
    for (auto [p, c] : {std::pair<const char*, int64_t>{"bn1", 4}, {"bn2", 6}, {"bn3", 5}})
      for (auto& s : bn_specs(p, c)) n.specs.push_back(s);
    n.make = [](const Weights& w) {
      Graph g;
      ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 4}));
      ValueId h = g.add_node1(OpKind::kConv, {x, add_weight(g, w, "conv.weight", {4, 3, 3, 3}),
                                              add_weight(g, w, "conv.bias", {4})}, conv2d_attrs(2, 1, 1));
      h = g.add_node1(OpKind::kRelu, {batch_norm(g, w, h, "bn1", 4)});
      Attrs up = conv2d_attrs(2, 0, 2);
      up.set("output_padding", Shape{0, 0});
      h = g.add_node1(OpKind::kConvTranspose, {h, add_weight(g, w, "up.weight", {4, 3, 2, 2}),
                                                add_weight(g, w, "up.bias", {6})}, up);
      h = batch_norm(g, w, h, "bn2", 6);
      Attrs flat;
      flat.set("shape", Shape{2, 6 * 4 * 4});
      h = g.add_node1(OpKind::kReshape, {h}, flat);
      h = g.add_node1(OpKind::kLinear, {h, add_weight(g, w, "fc1.weight", {5, 96})});
      h = g.add_node1(OpKind::kRelu, {batch_norm(g, w, h, "bn3", 5)});
      Attrs f16, f32;
      f16.set("dtype", DType::kF16);
      f32.set("dtype", DType::kF32);
      ValueId w2 = g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kCast, {add_weight(g, w, "fc2.weight", {3, 5})}, f16)},
                               f32);
      g.mark_output(g.add_node1(OpKind::kLinear, {h, w2, add_weight(g, w, "fc2.bias", {3})}), "y");
      return g;
    };
    return n;
  }();
  return net;
}

// Weights large enough for the refit's threaded element-wise path (more than one 16384-element
// tile per row): x * w1 + w2 with w1 rounded through f16 and w2 through bf16 (20000 elements
// each, one row), then a linear whose weight goes through f16 before a batch norm folds into
// it ([8, 20000]: the fold's per-row scale broadcasts over two tiles a row).
const Net& wide_net() {
  static const Net net = [] {
    Net n;
    n.specs = {{"w1", {20000}}, {"w2", {20000}}, {"fc.weight", {8, 20000}}};
    for (auto& s : bn_specs("bn", 8)) n.specs.push_back(s);
    n.make = [](const Weights& w) {
      Graph g;
      auto through = [&](ValueId v, DType d) {
        Attrs lo, hi;
        lo.set("dtype", d);
        hi.set("dtype", DType::kF32);
        return g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kCast, {v}, lo)}, hi);
      };
      ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 20000}));
      ValueId h = g.add_node1(OpKind::kMul, {x, through(add_weight(g, w, "w1", {20000}), DType::kF16)});
      h = g.add_node1(OpKind::kAdd, {h, through(add_weight(g, w, "w2", {20000}), DType::kBF16)});
      h = g.add_node1(OpKind::kLinear, {h, through(add_weight(g, w, "fc.weight", {8, 20000}), DType::kF16)});
      g.mark_output(batch_norm(g, w, h, "bn", 8), "y");
      return g;
    };
    return n;
  }();
  return net;
}

std::shared_ptr<Engine> build(const Graph& g, bool refittable = true) {
  BuilderConfig c;
  c.refittable = refittable;
  return Builder(c).build(g);
}

Floats run(const Engine& e, ExecutionContext& ctx, const Floats& x) {
  Floats y(size_t(e.outputs()[0].type.numel()), std::nanf(""));
  ctx.execute({x.data()}, {y.data()});
  return y;
}
Floats run(const std::shared_ptr<Engine>& e, const Floats& x) { return run(*e, *e->create_execution_context(), x); }

void set_all(Refitter& r, const Net& net, const Weights& w) {
  for (const auto& s : net.specs) r.set_weight(s.name, TensorType(DType::kF32, s.shape), w.at(s.name).data());
}

// name (or position for unnamed ones) -> bytes of every constant of the plan, bodies included.
std::map<std::string, Bytes> constants_of(const Graph& plan) {
  std::map<std::string, Bytes> out;
  for (ValueId c : plan.constants())
    if (plan.num_uses(c)) out[plan.value(c).name + "#" + std::to_string(c)] = Bytes(plan.value(c).data->begin(), plan.value(c).data->end());
  return out;
}

void expect_bits_equal(const Floats& got, const Floats& want) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "outputs differ in their bits";
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

// ---- the recorded program --------------------------------------------------------------

TEST(RefitProgram, RecordsBatchNormFoldsAndCasts) {
  const Net& net = conv_net();
  auto e = build(net.make(random_weights(net.specs, 1)));
  ASSERT_TRUE(e->refittable());
  const Graph& p = *e->refit_program();
  std::vector<std::string> inputs;
  for (ValueId in : p.inputs()) inputs.push_back(p.value(in).name);
  std::sort(inputs.begin(), inputs.end());
  std::vector<std::string> want;
  for (const auto& s : net.specs)
    if (s.name != "fc2.bias") want.push_back(s.name);  // fc2.bias is used as it is
  std::sort(want.begin(), want.end());
  EXPECT_EQ(inputs, want);
  // W' and b' of three folds, and the f16-rounded fc2.weight.
  EXPECT_EQ(p.outputs().size(), 7u);
  int casts = 0;
  for (const auto& n : p.nodes()) casts += n->op == OpKind::kCast;
  EXPECT_GE(casts, 2);
  EXPECT_EQ(e->weight_names(), std::vector<std::string>{"fc2.bias"});
  Refitter r(e);
  want.push_back("fc2.bias");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(r.weight_names(), want);
  // Every output names a plan constant of its type; no batch_norm is left in the plan.
  for (ValueId out : p.outputs()) {
    bool found = false;
    for (ValueId c : e->graph().constants())
      found = found || (e->graph().value(c).name == p.value(out).name && e->graph().type(c) == p.type(out));
    EXPECT_TRUE(found) << p.value(out).name;
  }
  for (const auto& n : e->graph().nodes()) EXPECT_NE(n->op, OpKind::kBatchNorm);
}

TEST(RefitProgram, ImmutableEnginesKeepNoProgramAndRefuseARefit) {
  const Net& net = conv_net();
  const Weights w = random_weights(net.specs, 2);
  auto e = build(net.make(w), false);
  EXPECT_FALSE(e->refittable());
  EXPECT_EQ(e->refit_program(), nullptr);
  std::string msg;
  EXPECT_EQ(code_of([&] { Refitter r(e); }, &msg), ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("immutable weights"), std::string::npos) << msg;
  // Same plan and outputs as the refittable build; the loaded file stays immutable.
  Floats x = random_floats(2 * 3 * 4 * 4, 3);
  expect_bits_equal(run(e, x), run(build(net.make(w)), x));
  Bytes file = e->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  EXPECT_FALSE(loaded->refittable());
  EXPECT_EQ(code_of([&] { Refitter r(loaded); }, &msg), ErrorCode::kUnsupported);
}

// ---- refit == fresh build ---------------------------------------------------------------

TEST(Refit, EqualsAFreshBuildBitForBit) {
  const Net& net = conv_net();
  const Weights a = random_weights(net.specs, 10), b = random_weights(net.specs, 20);
  auto e = build(net.make(a));
  auto ctx_before = e->create_execution_context();  // made before the refit
  Floats x = random_floats(2 * 3 * 4 * 4, 4);
  Floats old_y = run(*e, *ctx_before, x);
  Refitter r(e);
  set_all(r, net, b);
  EXPECT_TRUE(r.missing_weights().empty());
  r.refit();
  EXPECT_EQ(e->weights_version(), 1u);
  auto fresh = build(net.make(b));
  EXPECT_EQ(constants_of(e->graph()), constants_of(fresh->graph()));
  Floats want = run(fresh, x);
  ASSERT_NE(std::memcmp(old_y.data(), want.data(), want.size() * 4), 0) << "the weights did not change the output";
  expect_bits_equal(run(*e, *ctx_before, x), want);  // the old context sees the new weights
  expect_bits_equal(run(e, x), want);
  // Refitting back gives the original engine again.
  set_all(r, net, a);
  r.refit();
  expect_bits_equal(run(*e, *ctx_before, x), old_y);
}

TEST(Refit, WideCastsAndFoldsEqualAFreshBuildBitForBit) {
  const Net& net = wide_net();
  const Weights a = random_weights(net.specs, 50), b = random_weights(net.specs, 60);
  auto e = build(net.make(a));
  const Floats x = random_floats(2 * 20000, 5);
  const Floats old_y = run(e, x);
  Refitter r(e);
  set_all(r, net, b);
  r.refit();
  auto fresh = build(net.make(b));
  EXPECT_EQ(constants_of(e->graph()), constants_of(fresh->graph()));
  const Floats want = run(fresh, x);
  ASSERT_NE(std::memcmp(old_y.data(), want.data(), want.size() * 4), 0) << "the weights did not change the output";
  expect_bits_equal(run(e, x), want);
  EXPECT_NE(r.report().find("refit: " + std::to_string(net.specs.size()) + " weights"), std::string::npos)
      << r.report();
}

TEST(Refit, APlanWeightAloneAndWeightsNeededTogether) {
  const Net& net = conv_net();
  Weights a = random_weights(net.specs, 30);
  auto e = build(net.make(a));
  Refitter r(e);
  Floats x = random_floats(2 * 3 * 4 * 4, 5);
  // fc2.bias is a plan weight: it refits alone.
  Weights b = a;
  b["fc2.bias"] = random_floats(3, 31);
  r.set_weight("fc2.bias", TensorType(DType::kF32, {3}), b["fc2.bias"].data());
  r.refit();
  expect_bits_equal(run(e, x), run(build(net.make(b)), x));
  // bn1.weight only exists folded into conv: its companions are asked for.
  b["bn1.weight"] = random_floats(4, 32);
  r.set_weight("bn1.weight", TensorType(DType::kF32, {4}), b["bn1.weight"].data());
  std::vector<std::string> missing = r.missing_weights();
  EXPECT_EQ(missing, (std::vector<std::string>{"bn1.bias", "bn1.running_mean", "bn1.running_var", "conv.bias",
                                               "conv.weight"}));
  std::string msg;
  EXPECT_EQ(code_of([&] { r.refit(); }, &msg), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'conv.weight'"), std::string::npos) << msg;
  EXPECT_EQ(e->weights_version(), 1u);  // nothing changed
  for (const std::string& n : missing) {
    const WeightSpec& s = *std::find_if(net.specs.begin(), net.specs.end(), [&](auto& sp) { return sp.name == n; });
    r.set_weight(n, TensorType(DType::kF32, s.shape), b.at(n).data());
  }
  r.refit();
  expect_bits_equal(run(e, x), run(build(net.make(b)), x));
}

TEST(Refit, WrongNameShapeOrDtypeNamesTheWeight) {
  const Net& net = conv_net();
  auto e = build(net.make(random_weights(net.specs, 40)));
  Refitter r(e);
  Floats v = random_floats(200, 41);
  std::string msg;
  EXPECT_EQ(code_of([&] { r.set_weight("conv.wieght", TensorType(DType::kF32, {4, 3, 3, 3}), v.data()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("no weight named 'conv.wieght'"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { r.set_weight("conv.weight", TensorType(DType::kF32, {4, 3, 3}), v.data()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'conv.weight' must have shape f32[4,3,3,3]"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { r.set_weight("fc2.bias", TensorType(DType::kF16, {3}), v.data()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'fc2.bias' must be f32"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { r.set_weight("fc2.bias", TensorType(DType::kF32, {3}), nullptr); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(r.missing_weights().empty());  // nothing was kept
  r.refit();                                 // and nothing happens
  EXPECT_EQ(e->weights_version(), 1u);
}

// ---- engine files -----------------------------------------------------------------------

TEST(RefitFile, SerializeAfterRefitWritesTheNewWeightsAndKeepsTheProgram) {
  const Net& net = conv_net();
  const Weights a = random_weights(net.specs, 50), b = random_weights(net.specs, 60), c = random_weights(net.specs, 70);
  auto e = build(net.make(a));
  Refitter r(e);
  set_all(r, net, b);
  r.refit();
  Bytes file = e->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  ASSERT_TRUE(loaded->refittable());
  EXPECT_EQ(loaded->refit_program()->to_string(), e->refit_program()->to_string());
  Floats x = random_floats(2 * 3 * 4 * 4, 6);
  auto fresh_b = build(net.make(b));
  expect_bits_equal(run(loaded, x), run(fresh_b, x));
  EXPECT_EQ(constants_of(loaded->graph()), constants_of(fresh_b->graph()));
  // The loaded engine refits like the built one.
  Refitter lr(loaded);
  set_all(lr, net, c);
  lr.refit();
  expect_bits_equal(run(loaded, x), run(build(net.make(c)), x));
}

TEST(RefitFile, AMappedEngineSharesTheFileAndRefitsPrivately) {
  const Net& net = conv_net();
  const Weights a = random_weights(net.specs, 80), b = random_weights(net.specs, 90);
  auto e = build(net.make(a));
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_mapped_" + std::to_string(::getpid()) + ".kiln")).string();
  e->save(path);
  const Bytes file = e->serialize();
  auto mapped = Engine::load_mapped(path);
  EXPECT_NE(mapped->build_log().find("mapped"), std::string::npos);
  bool any_view = false;
  for (ValueId c : mapped->graph().constants()) any_view = any_view || mapped->graph().value(c).data->is_view();
  EXPECT_TRUE(any_view) << "the weights are views of the mapping, not copies";
  EXPECT_EQ(constants_of(mapped->graph()), constants_of(e->graph()));
  Floats x = random_floats(2 * 3 * 4 * 4, 7);
  expect_bits_equal(run(mapped, x), run(e, x));
  // A refit writes the mapped pages: the engine sees the new weights, the file does not change.
  Refitter r(mapped);
  set_all(r, net, b);
  r.refit();
  expect_bits_equal(run(mapped, x), run(build(net.make(b)), x));
  std::ifstream in(path, std::ios::binary);
  const Bytes on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(on_disk == file) << "a refit of a mapped engine must not write the file";
  // The file may go (the cache evicts by unlink): the mapping keeps the engine whole.
  std::filesystem::remove(path);
  expect_bits_equal(run(mapped, x), run(build(net.make(b)), x));
  // A damaged or missing file is an error naming it, as with load().
  Bytes bad = file;
  bad[bad.size() / 3] ^= 0x04;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bad.data()), long(bad.size()));
  EXPECT_EQ(code_of([&] { Engine::load_mapped(path); }), ErrorCode::kCorrupted);
  std::ofstream(path, std::ios::binary | std::ios::trunc).close();
  EXPECT_EQ(code_of([&] { Engine::load_mapped(path); }), ErrorCode::kTruncated);
  std::filesystem::remove(path);
  std::string message;
  EXPECT_EQ(code_of([&] { Engine::load_mapped(path); }, &message), ErrorCode::kIo);
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(RefitFile, DamagedRefitSectionsAreRejected) {
  const Net& net = conv_net();
  auto e = build(net.make(random_weights(net.specs, 80)));
  const Bytes file = e->serialize();
  const eft::Layout l = eft::parse_layout(file);
  const eft::SectionAt& rfit = eft::section(l, "RFIT");
  std::string msg;
  // An op name nobody knows.
  Bytes b = file;
  auto at = std::search(b.begin() + long(rfit.payload_at), b.begin() + long(rfit.payload_at + rfit.length),
                        std::begin("cast"), std::begin("cast") + 4);
  ASSERT_NE(at, b.begin() + long(rfit.payload_at + rfit.length));
  std::memcpy(&*at, "qqqq", 4);
  eft::reseal(b);
  EXPECT_EQ(eft::code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("RFIT"), std::string::npos) << msg;
  // A value count larger than the section.
  b = file;
  eft::put_le(b, rfit.payload_at, 1u << 30, 4);
  eft::reseal(b);
  ErrorCode code = eft::code_of(b, &msg);
  EXPECT_TRUE(code == ErrorCode::kTruncated || code == ErrorCode::kCorrupted) << msg;
  // A section cut short (its length shrinks by one byte, which moves into the next header).
  b = file;
  eft::put_le(b, rfit.length_at, rfit.length - 1, 8);
  eft::reseal(b);
  code = eft::code_of(b, &msg);
  EXPECT_TRUE(code == ErrorCode::kTruncated || code == ErrorCode::kCorrupted) << msg;
  // An output renamed so it names no constant of the plan.
  const Graph& p = *e->refit_program();
  const std::string out_name = p.value(p.outputs()[0]).name;
  b = file;
  at = std::search(b.begin() + long(rfit.payload_at), b.begin() + long(rfit.payload_at + rfit.length), out_name.begin(),
                   out_name.end());
  ASSERT_NE(at, b.begin() + long(rfit.payload_at + rfit.length));
  *(at + long(out_name.size()) - 1) = '~';
  eft::reseal(b);
  EXPECT_EQ(eft::code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("refit program output"), std::string::npos) << msg;
  // Every truncation point inside RFIT is a clean error.
  for (size_t cut = rfit.payload_at; cut < rfit.payload_at + rfit.length; cut += 7) {
    Bytes t(file.begin(), file.begin() + long(cut));
    EXPECT_EQ(eft::code_of(t, &msg), ErrorCode::kTruncated) << cut;
  }
}

}  // namespace

// A conv whose weight is large enough for the refit's fused elementwise path (the batch-norm
// fold W * scale evaluated tile by tile, written straight into the engine): the same bits as a
// fresh build, with the weights handed over as views.
TEST(Refit, LargeFoldedWeightsEqualAFreshBuildBitForBit) {
  Net net;
  net.specs = {{"conv.weight", {32, 16, 3, 3}}, {"conv.bias", {32}}};
  for (auto& s : bn_specs("bn", 32)) net.specs.push_back(s);
  net.make = [](const Weights& w) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 16, 6, 6}));
    ValueId h = g.add_node1(OpKind::kConv, {x, add_weight(g, w, "conv.weight", {32, 16, 3, 3}),
                                            add_weight(g, w, "conv.bias", {32})}, conv2d_attrs(1, 1, 1));
    g.mark_output(batch_norm(g, w, h, "bn", 32), "y");
    return g;
  };
  const Weights a = random_weights(net.specs, 30), b = random_weights(net.specs, 40);
  auto e = build(net.make(a));
  Floats x = random_floats(16 * 6 * 6, 5);
  Floats old_y = run(e, x);
  Refitter r(e);
  for (const auto& s : net.specs) r.set_weight_view(s.name, TensorType(DType::kF32, s.shape), b.at(s.name).data());
  r.refit();
  auto fresh = build(net.make(b));
  EXPECT_EQ(constants_of(e->graph()), constants_of(fresh->graph()));
  Floats want = run(fresh, x);
  ASSERT_NE(std::memcmp(old_y.data(), want.data(), want.size() * 4), 0) << "the weights did not change the output";
  expect_bits_equal(run(e, x), want);
}
