// Stand-in for <cuda_fp8.h>: see dcpemu_float_formats.h.
#pragma once
#include "dcpemu_float_formats.h"
