// The N = 4 model with one read port per input buffer and iSLIP matching
// in its crossbar (MATCH = 1; see shim.h).
#include "Vup_n4i.h"
#include "shim.h"

UP_SIM_DEFINE(up_n4i, Vup_n4i, 4, 2)
