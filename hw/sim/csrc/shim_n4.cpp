// The N = 4 model (see shim.h).
#include "Vup_n4.h"
#include "shim.h"

UP_SIM_DEFINE(up_n4, Vup_n4, 4, 2)
