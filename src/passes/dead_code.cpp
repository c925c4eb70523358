// STUB: eliminate_dead_code (to be written).
#include "kiln/passes.h"

namespace kiln {

bool eliminate_dead_code(Graph&) { return false; }

}  // namespace kiln
