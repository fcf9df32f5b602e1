// The N = 4 model with two read ports per input buffer and iSLIP matching
// in its crossbar (MATCH = 1, PORTS = 2; see shim.h).
#include "Vup_n4i.h"
#include "shim.h"

UP_SIM_DEFINE(up_n4i, Vup_n4i, 4, 2)
