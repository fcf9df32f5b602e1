// The N = 8 model (see shim.h).
#include "Vup_n8.h"
#include "shim.h"

UP_SIM_DEFINE(up_n8, Vup_n8, 8, 2)
