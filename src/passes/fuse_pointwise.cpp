// STUB: fuse_pointwise (to be written).
#include "kiln/passes.h"

namespace kiln {

bool fuse_pointwise(Graph&) { return false; }

}  // namespace kiln
