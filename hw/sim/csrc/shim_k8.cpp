// The N = 8 model with kernels on ports 6 (echo) and 7 (sum32); see shim.h
// and hw/rtl/kernels/up_top_kernels.v.
#include "Vup_k8.h"
#include "shim.h"

UP_SIM_DEFINE(up_k8, Vup_k8, 8, 2)
