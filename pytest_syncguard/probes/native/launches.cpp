// The launch log: a CUPTI callback that stamps, on the host's wall clock, when each launch call returned (kernel,
// graph, async copy or memset: the calls Python names by their callback ids), and hands every other callback to
// the CUDA-call probe's own (Python) callback. It is the process's one CUPTI subscriber's callback while the probe
// holds it (probes/cuda_calls.py); the sampled timeline reads the stamps to tell a gap the host was late for (a
// launch returned after the device went idle) from one whose work was queued before (analysis/sampled.py).
//
// Nothing of CUPTI is compiled in: the callback reads the first field of CUpti_CallbackData (the callback site,
// 0 on entry) and nothing else. A launch made inside another (a runtime launch's own driver launch) is part of it:
// one stamp, when the outer call returns. A stamp costs one clock read and one atomic increment.
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>

namespace py = pybind11;

namespace launch_log {

using Callback = void (*)(void*, int, uint32_t, const void*);

constexpr int kDomains = 3;         // CUpti_CallbackDomain: 1 driver, 2 runtime
constexpr uint32_t kCbids = 4096;   // every callback id of CUDA 12 and 13 is below this
constexpr uint64_t kCapacity = 1u << 21;  // stamps kept per log: two million launches

std::atomic<uint8_t> launches[kDomains][kCbids];  // 1: a launch call, stamped; 0: passed on
std::atomic<Callback> passed_to{nullptr};
std::atomic<bool> logging{false};
std::atomic<uint64_t> written{0};
std::unique_ptr<int64_t[]> stamps;
thread_local int depth = 0;

extern "C" void on_callback(void* userdata, int domain, uint32_t cbid, const void* data) {
  if (domain > 0 && domain < kDomains && cbid < kCbids &&
      launches[domain][cbid].load(std::memory_order_relaxed) != 0) {
    if (*static_cast<const int*>(data) == 0) {  // CUPTI_API_ENTER
      ++depth;
      return;
    }
    if (depth > 0 && --depth > 0) {
      return;  // the inner call of a launch
    }
    if (!logging.load(std::memory_order_acquire)) {
      return;
    }
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t index = written.fetch_add(1, std::memory_order_relaxed);
    if (index < kCapacity) {
      stamps[index] = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
    }
    return;
  }
  if (Callback next = passed_to.load(std::memory_order_acquire)) {
    next(userdata, domain, cbid, data);
  }
}

uintptr_t address() { return reinterpret_cast<uintptr_t>(&on_callback); }

void pass_to(uintptr_t callback) { passed_to.store(reinterpret_cast<Callback>(callback), std::memory_order_release); }

void mark(int domain, uint32_t cbid, bool launch) {
  if (domain <= 0 || domain >= kDomains || cbid >= kCbids) {
    throw std::out_of_range("syncguard: no such CUPTI callback domain or id");
  }
  launches[domain][cbid].store(launch ? 1 : 0, std::memory_order_relaxed);
}

// Start a log (one at a time): the stamps written before are dropped.
void start() {
  if (!stamps) {
    stamps.reset(new int64_t[kCapacity]);
  }
  written.store(0, std::memory_order_relaxed);
  logging.store(true, std::memory_order_release);
}

// Stop the log: (the stamps as bytes of int64 ns in the order written, the launches made, kept or not).
py::tuple stop() {
  logging.store(false, std::memory_order_release);
  uint64_t made = written.load(std::memory_order_relaxed);
  uint64_t kept = made < kCapacity ? made : kCapacity;
  py::bytes data(reinterpret_cast<const char*>(stamps.get()), kept * sizeof(int64_t));
  return py::make_tuple(data, made);
}

}  // namespace launch_log

void bind_launch_log(py::module_& m) {
  m.def("launch_callback", &launch_log::address, "The address of the CUPTI callback that stamps launches");
  m.def("launch_pass_to", &launch_log::pass_to, "The callback (an address; 0: none) that gets every other callback");
  m.def("launch_mark", &launch_log::mark, "Whether a callback (domain, id) is a launch call, stamped on return");
  m.def("launch_start", &launch_log::start, "Start stamping launch calls (the earlier stamps are dropped)");
  m.def("launch_stop", &launch_log::stop, "Stop: (int64 ns stamps as bytes, in the order written; launches made)");
}
