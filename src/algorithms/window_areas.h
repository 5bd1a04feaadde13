// How each rank's region of the shared window (transport::Window) is shared out among the
// algorithms that keep state there: the flat collectives' two areas first (flat_window.h; the
// part a transport makes resident at creation), then one page of stamps for the registered
// allreduce, then the direct allreduce's staging buffers to the end of the region.
#pragma once

#include <cstddef>

#include "transport/link.h"

namespace ringreduce::algorithms::window_areas {

inline constexpr size_t kFlatBytes = 2 * (size_t{64} << 10);
inline constexpr size_t kRegisteredOffset = kFlatBytes;
inline constexpr size_t kRegisteredBytes = 4096;
inline constexpr size_t kDirectOffset = kRegisteredOffset + kRegisteredBytes;
// The flat collectives' areas and the registered allreduce's stamps are what a transport makes
// resident at creation.
static_assert(kDirectOffset <= transport::Window::kHotBytes);

}  // namespace ringreduce::algorithms::window_areas
