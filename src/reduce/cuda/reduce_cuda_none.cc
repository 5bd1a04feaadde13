// reduce_cuda.h and runtime.h in a build without CUDA (RINGREDUCE_CUDA=OFF, or AUTO with no nvcc
// found): nothing is available, and says so; the calls that would need a device refuse.
#if !defined(RINGREDUCE_HAVE_CUDA)

#include <string>

#include "reduce/cuda/reduce_cuda.h"
#include "reduce/cuda/runtime.h"
#include "ringreduce/error.h"

namespace ringreduce::reduce::cuda {
namespace {

[[noreturn]] void refuse(const char* call) {
  throw InvalidArgument(std::string("reduce::cuda::") + call + ": " + unavailable_reason());
}

}  // namespace

std::string unavailable_reason() {
  return "ringreduce was built without CUDA (RINGREDUCE_CUDA=OFF, or no nvcc found; "
         "configure with -DRINGREDUCE_CUDA=ON and nvcc in /usr/local/cuda or CUDACXX)";
}
bool available() {
  return false;
}
std::string device_description() {
  return "none (" + unavailable_reason() + ")";
}
void combine(void*, const void*, const void*, size_t, DataType, ReduceOp, void*) {
  refuse("combine");
}
void combine2(void*, void*, const void*, const void*, size_t, DataType, ReduceOp, void*) {
  refuse("combine2");
}
void divide(void*, const void*, size_t, DataType, uint64_t, void*) {
  refuse("divide");
}
void scale(void*, const void*, size_t, DataType, double, void*) {
  refuse("scale");
}
DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  refuse("DeviceBuffer");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*, size_t, size_t) {
  refuse("DeviceBuffer::upload");
}
void DeviceBuffer::download(void*, size_t, size_t) const {
  refuse("DeviceBuffer::download");
}
void synchronize(void*) {
  refuse("synchronize");
}
void copy(void*, const void*, size_t, void*) {
  refuse("copy");
}
EventTimer::EventTimer() {
  refuse("EventTimer");
}
EventTimer::~EventTimer() = default;
void EventTimer::start(void*) {
  refuse("EventTimer::start");
}
void EventTimer::stop(void*) {
  refuse("EventTimer::stop");
}
double EventTimer::elapsed_ms() {
  refuse("EventTimer::elapsed_ms");
}

// runtime.h: CUDA is never in use through this build, so the communicator never stages.
bool in_use() {
  return false;
}
bool is_device_pointer(const void*) {
  return false;
}
PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  refuse("PinnedBuffer");
}
PinnedBuffer::~PinnedBuffer() = default;
Event::Event() {
  refuse("Event");
}
Event::~Event() = default;
void Event::record(void*) {
  refuse("Event::record");
}
bool Event::done() {
  refuse("Event::done");
}
void Event::wait_on(void*) {
  refuse("Event::wait_on");
}
int current_device() {
  refuse("current_device");
}
void set_current_device(int) {
  refuse("set_current_device");
}
void* create_stream() {
  refuse("create_stream");
}
void destroy_stream(void*) {
  refuse("destroy_stream");
}
void copy_async(void*, const void*, size_t, void*) {
  refuse("copy_async");
}
void wait_value(void*, const uint32_t*, uint32_t) {
  refuse("wait_value");
}
std::unique_ptr<SharedDeviceBuffer> SharedDeviceBuffer::create(size_t) {
  refuse("SharedDeviceBuffer::create");
}
std::unique_ptr<SharedDeviceBuffer> SharedDeviceBuffer::import(int, size_t) {
  refuse("SharedDeviceBuffer::import");
}
SharedDeviceBuffer::~SharedDeviceBuffer() = default;
int SharedDeviceBuffer::export_fd() const {
  refuse("SharedDeviceBuffer::export_fd");
}

}  // namespace ringreduce::reduce::cuda

#endif  // !RINGREDUCE_HAVE_CUDA
