// Bindings of kiln/builder.h and kiln/build_policy.h: BuildPolicy, BuilderConfig and Builder.
//
// BuildPolicy and BuilderConfig take keyword arguments whose defaults are the C++ defaults; the
// device is a string ("cpu", "cuda:0") parsed by Device::parse, the attention tactic a name
// ("auto", "generated", "cudnn"). The constructors validate, so an impossible setting fails
// where it is written rather than at build time.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "kiln/builder.h"
#include "kiln/errors.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

std::string policy_repr(const BuildPolicy& p) {
  return detail::concat("BuildPolicy(allow_tf32=", p.allow_tf32 ? "True" : "False",
                        ", exact_gelu=", p.exact_gelu ? "True" : "False", ", attention_tactic='",
                        attention_tactic_name(p.attention_tactic), "')");
}

std::string config_repr(const BuilderConfig& c) {
  std::ostringstream os;
  os << "BuilderConfig(enabled_precisions=[";
  for (size_t i = 0; i < c.enabled_precisions.size(); ++i)
    os << (i ? ", " : "") << "DType." << dtype_name(c.enabled_precisions[i]);
  os << "], workspace_limit=" << c.workspace_limit << ", optimization_level=" << c.optimization_level << ", device='"
     << c.device.to_string() << "', fuse_pointwise=" << (c.fuse_pointwise ? "True" : "False")
     << ", refittable=" << (c.refittable ? "True" : "False") << ", policy=" << policy_repr(c.policy) << ")";
  return os.str();
}

// A reference to a Python object that a C++ owner may drop from any thread: the last release
// takes the GIL (and leaks the reference once the interpreter is gone).
std::shared_ptr<const void> python_owner(nb::handle object) {
  Py_INCREF(object.ptr());
  return std::shared_ptr<const void>(object.ptr(), [](const void* p) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(const_cast<void*>(p)));
  });
}

// {weight name: (address, bytes, owner)} -> BorrowedWeights.
BorrowedWeights borrowed_weights(const nb::dict& borrowed) {
  BorrowedWeights out;
  for (auto [key, value] : borrowed) {
    auto t = nb::cast<nb::tuple>(value);
    KILN_CHECK(t.size() == 3, kInvalidArgument, "borrowed weight '", nb::cast<std::string>(key),
               "': expected (address, bytes, owner), got ", t.size(), " items");
    BorrowedWeight w;
    w.data = reinterpret_cast<const void*>(nb::cast<uintptr_t>(t[0]));
    w.size = nb::cast<size_t>(t[1]);
    w.owner = python_owner(t[2]);
    out.emplace(nb::cast<std::string>(key), std::move(w));
  }
  return out;
}

}  // namespace

void bind_builder(nb::module_& m) {
  const BuildPolicy default_policy;
  nb::class_<BuildPolicy>(m, "BuildPolicy",
                          "What a build may do to an engine's numbers (TF32, GELU's form) and which attention "
                          "tactic it takes; saved with the engine.")
      .def(
          "__init__",
          [](BuildPolicy* p, bool allow_tf32, bool exact_gelu, const std::string& attention_tactic) {
            BuildPolicy policy;
            policy.allow_tf32 = allow_tf32;
            policy.exact_gelu = exact_gelu;
            policy.attention_tactic = parse_attention_tactic(attention_tactic, "BuildPolicy.attention_tactic");
            new (p) BuildPolicy(policy);
          },
          nb::kw_only(), nb::arg("allow_tf32") = default_policy.allow_tf32,
          nb::arg("exact_gelu") = default_policy.exact_gelu,
          nb::arg("attention_tactic") = attention_tactic_name(default_policy.attention_tactic))
      .def_rw("allow_tf32", &BuildPolicy::allow_tf32,
              "f32 GEMMs and convolutions on CUDA may use TF32 tensor cores (False: strict f32).")
      .def_rw("exact_gelu", &BuildPolicy::exact_gelu,
              "Keep exact GELU exact (False: an f16/bf16 linear's GELU may run as cuBLASLt's tanh form).")
      .def_prop_rw(
          "attention_tactic",
          [](const BuildPolicy& p) { return std::string(attention_tactic_name(p.attention_tactic)); },
          [](BuildPolicy& p, const std::string& s) {
            p.attention_tactic = parse_attention_tactic(s, "BuildPolicy.attention_tactic");
          },
          "'auto' (timed), 'generated' or 'cudnn': the fused attention kernel of a CUDA sdpa.")
      .def(
          "__eq__", [](const BuildPolicy& a, const BuildPolicy& b) { return a == b; }, nb::is_operator())
      .def("__repr__", &policy_repr);

  const BuilderConfig defaults;
  nb::class_<BuilderConfig>(m, "BuilderConfig", "How the builder turns a network into an engine.")
      .def(
          "__init__",
          [](BuilderConfig* c, std::vector<DType> precisions, size_t workspace_limit, int level,
             const std::string& device, bool fuse, bool refittable, const BuildPolicy& policy) {
            BuilderConfig cfg;
            cfg.enabled_precisions = std::move(precisions);
            cfg.workspace_limit = workspace_limit;
            cfg.optimization_level = level;
            cfg.device = Device::parse(device);
            cfg.fuse_pointwise = fuse;
            cfg.refittable = refittable;
            cfg.policy = policy;
            cfg.validate();
            new (c) BuilderConfig(std::move(cfg));
          },
          nb::kw_only(), nb::arg("enabled_precisions") = defaults.enabled_precisions,
          nb::arg("workspace_limit") = defaults.workspace_limit,
          nb::arg("optimization_level") = defaults.optimization_level, nb::arg("device") = defaults.device.to_string(),
          nb::arg("fuse_pointwise") = defaults.fuse_pointwise, nb::arg("refittable") = defaults.refittable,
          nb::arg("policy") = defaults.policy)
      .def_rw("enabled_precisions", &BuilderConfig::enabled_precisions,
              "Compute types the builder may use (f32, f16, bf16).")
      .def_rw("workspace_limit", &BuilderConfig::workspace_limit, "Bytes of scratch per execution context.")
      .def_rw("optimization_level", &BuilderConfig::optimization_level, "0..5: how hard to search tactics.")
      .def_prop_rw(
          "device", [](const BuilderConfig& c) { return c.device.to_string(); },
          [](BuilderConfig& c, const std::string& s) { c.device = Device::parse(s); }, "'cpu' or 'cuda:N'.")
      .def_rw("fuse_pointwise", &BuilderConfig::fuse_pointwise)
      .def_rw("refittable", &BuilderConfig::refittable,
              "Keep a refit program so a Refitter can change the weights (False: immutable weights).")
      .def_rw("policy", &BuilderConfig::policy, "Numerics and tactic choices (BuildPolicy).")
      .def("validate", &BuilderConfig::validate, "Raises InvalidArgumentError naming the bad field.")
      .def("__repr__", &config_repr);

  nb::class_<Builder>(m, "Builder", "Turns a verified Graph into an Engine.")
      .def(nb::init<BuilderConfig>(), nb::arg("config") = BuilderConfig{})
      .def_prop_ro(
          "config", [](const Builder& b) { return b.config(); }, "A copy of the configuration.")
      .def(
          "build",
          [](const Builder& b, const Graph& network, const std::optional<nb::dict>& borrowed) {
            const BorrowedWeights weights = borrowed ? borrowed_weights(*borrowed) : BorrowedWeights{};
            nb::gil_scoped_release release;  // the build touches no Python object; other threads run
            return b.build(network, weights);
          },
          nb::arg("network"), nb::arg("borrowed") = nb::none(),
          nb::sig("def build(self, network: Graph, borrowed: dict[str, tuple[int, int, object]] | None = None) "
                  "-> Engine"),
          "Copies the network, runs the passes, picks kernels and returns an Engine. ``borrowed``: "
          "{weight name: (address, bytes, owner)} of weights, dense and in the plan weight's dtype on the "
          "engine's device, that the engine may read in place instead of copying (``owner`` is kept "
          "alive as long as the engine reads them). Other Python threads run meanwhile.")
      .def(
          "optimize", [](const Builder& b, const Graph& network) { return b.optimize(network); }, nb::arg("network"),
          nb::call_guard<nb::gil_scoped_release>(),
          "The plan graph build() would give the backend: the network after this config's passes (for "
          "its device type; no device is needed), before kernels are chosen. Other Python threads run "
          "meanwhile.");
}

}  // namespace kiln::python
