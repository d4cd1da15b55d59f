// Stand-in for <cuda_fp16.h>: see dcpemu_float_formats.h.
#pragma once
#include "dcpemu_float_formats.h"
