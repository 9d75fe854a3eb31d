// The launch log: a CUPTI callback that stamps, on the host's wall clock, when each launch call (a kernel's, a
// graph's or an asynchronous copy's: the calls Python names by their callback ids) was entered and when it returned,
// and hands every other callback, and the copies', to the CUDA-call probe's own (Python) callback. It is the process's one CUPTI subscriber's callback
// while the probe holds it (probes/cuda_calls.py); the sampled timeline reads the stamps to tell a gap the host was
// late for (a launch returned after the device went idle, or was still running when it resumed: a graph's launch
// call runs on while the device starts the graph) from one whose work was queued before (analysis/sampled.py).
//
// A graph launch's stamp keeps the graph it launched (the executable graph, the first field of the call's
// parameters in both APIs: cudaGraphLaunch's graphExec, cuGraphLaunch's hGraphExec), which says what the replay
// held (probes/graph_nodes.py).
//
// Nothing of CUPTI is compiled in: the callback reads two fields of CUpti_CallbackData (the callback site, 0 on
// entry; and the call's parameters, for a graph launch) and nothing else. A launch made inside another (a runtime
// launch's own driver launch) is part of it: one stamp, from the outer call's entry to its return. A stamp costs
// two clock reads and one atomic increment.
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <stdexcept>

namespace py = pybind11;

namespace launch_log {

using Callback = void (*)(void*, int, uint32_t, const void*);

constexpr int kDomains = 3;         // CUpti_CallbackDomain: 1 driver, 2 runtime
constexpr uint32_t kCbids = 4096;   // every callback id of CUDA 12 and 13 is below this
constexpr uint64_t kCapacity = 1u << 21;  // stamps kept per log: two million launches
// Where CUpti_CallbackData keeps the call's parameters: after the callback site (an enum, padded to a pointer)
// and the function's name (cupti_callbacks.h, unchanged since CUDA 4).
constexpr size_t kParamsOffset = 2 * sizeof(void*);
static_assert(sizeof(void*) == 8, "the launch log reads CUPTI's 64-bit layout");

// A callback is passed on, or stamped: a launch, a graph launch, or an asynchronous copy, which is stamped and
// passed on too (the CUDA-call probe counts the transfers among them).
enum Kind : uint8_t { kPassedOn = 0, kLaunch = 1, kGraphLaunch = 2, kCopy = 3 };
std::atomic<uint8_t> launches[kDomains][kCbids];  // a Kind per callback
std::atomic<Callback> passed_to{nullptr};
std::atomic<bool> logging{false};
std::atomic<uint64_t> written{0};
std::unique_ptr<int64_t[]> stamps;
std::unique_ptr<uint64_t[]> graphs;  // per stamp: the graph a graph launch launched, else 0
std::unique_ptr<int64_t[]> entries;  // per stamp: when its call was entered
thread_local int depth = 0;
thread_local int64_t entered = 0;  // when this thread's outermost launch call was entered

int64_t now_ns() {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Stamp one callback of a logged call: its entry (the outermost call's, on this thread) and its return.
void stamp(uint8_t kind, const void* data) {
  if (*static_cast<const int*>(data) == 0) {  // CUPTI_API_ENTER
    if (depth++ == 0) {
      entered = now_ns();
    }
    return;
  }
  if (depth > 0 && --depth > 0) {
    return;  // the inner call of a launch
  }
  if (!logging.load(std::memory_order_acquire)) {
    return;
  }
  int64_t returned = now_ns();
  uint64_t index = written.fetch_add(1, std::memory_order_relaxed);
  if (index < kCapacity) {
    stamps[index] = returned;
    entries[index] = entered != 0 && entered <= returned ? entered : returned;
    uint64_t graph = 0;
    if (kind == kGraphLaunch) {
      const void* params = *reinterpret_cast<const void* const*>(static_cast<const char*>(data) + kParamsOffset);
      graph = params != nullptr ? *static_cast<const uint64_t*>(params) : 0;
    }
    graphs[index] = graph;
  }
}

extern "C" void on_callback(void* userdata, int domain, uint32_t cbid, const void* data) {
  uint8_t kind = domain > 0 && domain < kDomains && cbid < kCbids
                     ? launches[domain][cbid].load(std::memory_order_relaxed)
                     : kPassedOn;
  if (kind != kPassedOn) {
    stamp(kind, data);
    if (kind != kCopy) {
      return;
    }
  }
  if (Callback next = passed_to.load(std::memory_order_acquire)) {
    next(userdata, domain, cbid, data);
  }
}

uintptr_t address() { return reinterpret_cast<uintptr_t>(&on_callback); }

void pass_to(uintptr_t callback) { passed_to.store(reinterpret_cast<Callback>(callback), std::memory_order_release); }

void mark(int domain, uint32_t cbid, int kind) {
  if (domain <= 0 || domain >= kDomains || cbid >= kCbids) {
    throw std::out_of_range("syncguard: no such CUPTI callback domain or id");
  }
  if (kind < kPassedOn || kind > kCopy) {
    throw std::invalid_argument(
        "syncguard: a launch log's kind is 0 (passed on), 1 (launch), 2 (graph launch) or 3 (copy)");
  }
  launches[domain][cbid].store(uint8_t(kind), std::memory_order_relaxed);
}

// Start a log (one at a time): the stamps written before are dropped.
void start() {
  if (!stamps) {
    stamps.reset(new int64_t[kCapacity]);
    graphs.reset(new uint64_t[kCapacity]);
    entries.reset(new int64_t[kCapacity]);
  }
  written.store(0, std::memory_order_relaxed);
  logging.store(true, std::memory_order_release);
}

// Stop the log: (the stamps as bytes of int64 ns in the order written, the launches made, kept or not, per stamp
// the graph launched as bytes of uint64, 0 where it launched none, and per stamp when its call was entered).
py::tuple stop() {
  logging.store(false, std::memory_order_release);
  uint64_t made = written.load(std::memory_order_relaxed);
  uint64_t kept = made < kCapacity ? made : kCapacity;
  py::bytes data(reinterpret_cast<const char*>(stamps.get()), kept * sizeof(int64_t));
  py::bytes launched(reinterpret_cast<const char*>(graphs.get()), kept * sizeof(uint64_t));
  py::bytes began(reinterpret_cast<const char*>(entries.get()), kept * sizeof(int64_t));
  return py::make_tuple(data, made, launched, began);
}

}  // namespace launch_log

void bind_launch_log(py::module_& m) {
  m.def("launch_callback", &launch_log::address, "The address of the CUPTI callback that stamps launches");
  m.def("launch_pass_to", &launch_log::pass_to, "The callback (an address; 0: none) that gets every other callback");
  m.def("launch_mark", &launch_log::mark,
        "What a callback (domain, id) is: 0 passed on, 1 a launch, 2 a graph launch, 3 a copy (stamped, passed on)");
  m.def("launch_start", &launch_log::start, "Start stamping launch calls (the earlier stamps are dropped)");
  m.def("launch_stop", &launch_log::stop,
        "Stop: (int64 ns stamps as bytes, in the order written; launches made; uint64 graph per stamp as bytes; "
        "int64 ns each call was entered as bytes)");
}
