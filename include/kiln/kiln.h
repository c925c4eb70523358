// The public C++ API of Kiln.
#pragma once

#include "kiln/backend.h"
#include "kiln/builder.h"
#include "kiln/bundle.h"
#include "kiln/dtype.h"
#include "kiln/engine.h"
#include "kiln/errors.h"
#include "kiln/import.h"
#include "kiln/ir.h"
#include "kiln/ops.h"
#include "kiln/passes.h"
