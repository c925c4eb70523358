// STUB: kiln._C (to be written).
#include <nanobind/nanobind.h>
NB_MODULE(_C, m) { m.doc() = "Kiln core bindings"; }
