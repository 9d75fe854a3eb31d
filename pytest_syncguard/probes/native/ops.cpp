// The operator counter: one RecordFunction callback on the dispatcher's FUNCTION scope, the scope torch.profiler
// records as `cpu_op` events. It counts every operator call the dispatcher observes, on every thread, by name,
// and records nothing else: no inputs, no ids, no timestamps, no end callback. While no region is measured it
// is removed, so the dispatcher takes its fast path again; in a measured test's child process it stays for the
// process's life, adding each call to a running total the test reads (`share`).
#include <ATen/record_function.h>
#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace op_counter {

// One operator's count on one thread. Only that thread writes it; a reader may load it at any time.
struct Count {
  std::string name;
  std::atomic<uint64_t> calls{0};
  explicit Count(const char* text) : name(text) {}
};

// The counts of one thread, keyed by the address of the operator's name: the dispatcher passes the name held by
// the operator's schema, the same address on every call. A name kept elsewhere (a RecordFunction named by a
// string) may reuse an address, so a hit is checked against the copy and a mismatch counted by text instead.
struct ThreadCounts {
  std::mutex inserting;  // held while a key is added, and while another thread reads the maps
  std::unordered_map<const char*, Count> by_address;
  std::unordered_map<std::string, Count> by_text;

  Count& find(const char* name) {
    auto found = by_address.find(name);
    if (found != by_address.end() && std::strcmp(found->second.name.c_str(), name) == 0) {
      return found->second;
    }
    std::lock_guard<std::mutex> lock(inserting);
    if (found == by_address.end()) {
      return by_address.try_emplace(name, name).first->second;
    }
    return by_text.try_emplace(std::string(name), name).first->second;
  }
};

std::mutex mutex;  // guards `threads`, `handle` and `users`
std::vector<ThreadCounts*> threads;  // every thread that ever counted; kept after it ends, its counts with it
at::CallbackHandle handle = 0;
int users = 0;

ThreadCounts& this_thread() {
  thread_local ThreadCounts* mine = [] {
    auto* counts = new ThreadCounts();
    std::lock_guard<std::mutex> lock(mutex);
    threads.push_back(counts);
    return counts;
  }();
  return *mine;
}

// The process's running total in a file another process maps (a measured test's child: the test reads it at its
// regions' edges), or null. Lock-free 64-bit atomics are address-free, so they work across processes.
std::atomic<std::atomic<uint64_t>*> shared_total{nullptr};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

std::unique_ptr<at::ObserverContext> on_call(const at::RecordFunction& fn) {
  std::atomic<uint64_t>& calls = this_thread().find(fn.name()).calls;
  calls.store(calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (std::atomic<uint64_t>* total = shared_total.load(std::memory_order_relaxed)) {
    total->fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

// Keep a running total of the calls counted from now on in the 8 bytes of file `path` (made, or emptied), for
// another process to read while this one runs.
void share(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, sizeof(uint64_t)) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("syncguard: the operator total's file could not be made: " + path);
  }
  void* mapped = ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) {
    throw std::runtime_error("syncguard: the operator total's file could not be mapped: " + path);
  }
  shared_total.store(new (mapped) std::atomic<uint64_t>(0), std::memory_order_release);
}

// Start counting (nested starts keep one callback); the counts run on from where they were.
void start() {
  std::lock_guard<std::mutex> lock(mutex);
  if (users++ == 0) {
    handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_call)
                                       .scopes({at::RecordScope::FUNCTION})
                                       .needsInputs(false)
                                       .needsOutputs(false)
                                       .needsIds(false));
  }
}

void stop() {
  at::CallbackHandle removed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (users == 0) {
      throw std::runtime_error("syncguard: the operator counter was stopped more often than started");
    }
    if (--users == 0) {
      removed = handle;
      handle = 0;
    }
  }
  if (removed != 0) {
    at::removeCallback(removed);
  }
}

// The calls counted so far by operator name, all threads added up (they only grow: a region subtracts what it
// found at its start).
py::dict counts() {
  std::unordered_map<std::string, uint64_t> totals;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (ThreadCounts* thread : threads) {
      std::lock_guard<std::mutex> inserting(thread->inserting);
      for (const auto& [key, count] : thread->by_address) {
        totals[count.name] += count.calls.load(std::memory_order_relaxed);
      }
      for (const auto& [key, count] : thread->by_text) {
        totals[count.name] += count.calls.load(std::memory_order_relaxed);
      }
    }
  }
  py::dict result;
  for (const auto& [name, calls] : totals) {
    result[py::str(name)] = calls;
  }
  return result;
}

}  // namespace op_counter

void bind_op_counter(py::module_& m) {
  m.def("ops_start", &op_counter::start, "Count operator calls (FUNCTION scope, every thread) until the matching ops_stop()");
  m.def("ops_stop", &op_counter::stop, "Stop counting once every ops_start() has its ops_stop()");
  m.def("ops_counts", &op_counter::counts, "Operator calls counted so far, by name: {name: count}");
  m.def("ops_share", &op_counter::share, "Keep a running total of the calls counted from now on in a file's 8 bytes");
}
