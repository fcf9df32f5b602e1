// The N = 8 model with two read ports per input buffer and iSLIP matching
// in its crossbar (MATCH = 1, PORTS = 2; see shim.h).
#include "Vup_n8i.h"
#include "shim.h"

UP_SIM_DEFINE(up_n8i, Vup_n8i, 8, 2)
