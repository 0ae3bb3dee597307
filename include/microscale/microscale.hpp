// Umbrella header: everything the public C++ API offers.
#pragma once

#include "microscale/codecs.hpp"
#include "microscale/dtype.hpp"
#include "microscale/format.hpp"
#include "microscale/gptq.hpp"
#include "microscale/io.hpp"
#include "microscale/matmul.hpp"
#include "microscale/quantize.hpp"
#include "microscale/runtime.hpp"
#include "microscale/tensor.hpp"
