// Everything a C++ user of ringreduce includes.
#pragma once

#include "ringreduce/communicator.h"
#include "ringreduce/error.h"
#include "ringreduce/options.h"
#include "ringreduce/store.h"
#include "ringreduce/types.h"
