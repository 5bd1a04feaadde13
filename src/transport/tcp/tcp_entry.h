// TCP's row of the transport table (kind_row.h).
#pragma once

#include "transport/kind_row.h"

namespace ringreduce::transport::tcp {

KindEntry kind_entry();

}  // namespace ringreduce::transport::tcp
