// Stand-in for <cuda_bf16.h>: see dcpemu_float_formats.h.
#pragma once
#include "dcpemu_float_formats.h"
