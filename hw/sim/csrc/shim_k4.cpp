// The N = 4 model with kernels on ports 2 (echo) and 3 (sum32); see shim.h
// and hw/rtl/kernels/up_top_kernels.v.
#include "Vup_k4.h"
#include "shim.h"

UP_SIM_DEFINE(up_k4, Vup_k4, 4, 2)
