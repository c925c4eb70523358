// STUB: fold_constants (to be written).
#include "kiln/passes.h"

namespace kiln {

bool fold_constants(Graph&) { return false; }

}  // namespace kiln
