// Must compile: kv/ sees its own headers and those of the layers it links (ops, quant, base).
// Built beside the wrong-way probe so that a failure of that probe means the include was refused,
// not that the probe setup is broken.
#include "kvl/kv_manager.h"
#include "kvl/ops.h"
#include "kvl/status.h"
