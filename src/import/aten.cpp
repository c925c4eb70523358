// STUB: ATen import (to be written).
#include "kiln/errors.h"
#include "kiln/import.h"

namespace kiln {

ImportSupport can_import(const ImportNode& node, const ImportGraph&) { return {false, "no importer for " + node.target}; }
Graph import_aten(const ImportGraph&) { KILN_FAIL(kUnsupported, "ATen import not implemented yet"); }
std::vector<std::string> supported_aten_targets() { return {}; }

}  // namespace kiln
