// Device links' row of the transport table (device_kind.h).
#pragma once

#include "transport/kind_row.h"

namespace ringreduce::transport::device {

KindEntry kind_entry();

}  // namespace ringreduce::transport::device
