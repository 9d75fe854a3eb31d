// The race probe's access check: host memory ranges that a non_blocking copy may still be writing (device->host
// destinations) or reading (host->device sources), and one RecordFunction callback that looks at the host tensors
// every operator is given while at least one range is watched. An operator that reads a watched destination, or
// writes a watched range, is handed to Python (probes/races.py), which reports it with its call site.
//
// While nothing is watched the callback is not registered: operators take the dispatcher's fast path. A view
// (an argument the schema marks as aliased but not written: select, slice, detach, ...) reads nothing, and a copy
// to or from the device is device work, not a host access.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <Python.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace race_watch {

struct Watch {
  int64_t id;
  uintptr_t start;
  uintptr_t end;
  bool reads;  // a read is a race too (a device->host destination); else only a write (a host->device source)
  // The copy's host storage, when known: only an access of that storage, while it lives, races. Pinned memory freed
  // and allocated again holds a new storage (the host allocator reuses it only once the copy has completed).
  const c10::StorageImpl* impl = nullptr;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
};

// How an operator uses each argument: 0 reads it, 1 writes it, 2 only aliases it (a view).
enum Use : int { READ = 0, WRITE = 1, VIEW = 2 };

std::mutex mutex;  // guards everything below
std::vector<Watch> watches;
at::CallbackHandle handle = 0;
py::object on_access;  // on_access(watch id, operator name, wrote) under the GIL
std::unordered_map<std::string, std::vector<int>> uses;

const std::vector<int>& uses_of(const at::RecordFunction& fn) {
  std::string name = fn.name();
  auto found = uses.find(name);
  if (found != uses.end()) {
    return found->second;
  }
  std::vector<int> kinds;
  auto op = fn.operator_name();
  if (op.has_value()) {
    auto handle = c10::Dispatcher::singleton().findOp(*op);
    if (handle.has_value() && handle->hasSchema()) {
      for (const auto& argument : handle->schema().arguments()) {
        const auto* alias = argument.alias_info();
        kinds.push_back(alias == nullptr ? READ : alias->isWrite() ? WRITE : VIEW);
      }
    }
  }
  return uses.emplace(name, std::move(kinds)).first->second;
}

// The bytes a strided tensor may touch: from its first element to its last.
}  // namespace race_watch

bool race_extent(const at::Tensor& tensor, uintptr_t* start, uintptr_t* end) {
  if (!tensor.defined() || !tensor.is_cpu() || !tensor.has_storage() || tensor.numel() == 0) {
    return false;
  }
  int64_t last = 0;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    last += (tensor.size(d) - 1) * tensor.stride(d);
  }
  *start = reinterpret_cast<uintptr_t>(tensor.const_data_ptr());
  *end = *start + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(tensor.element_size()));
  return true;
}

namespace race_watch {

struct Hit {
  int64_t id;
  bool wrote;
};

void check(const at::Tensor& tensor, int use, std::vector<Hit>* hits) {
  uintptr_t start = 0, end = 0;
  if (use == VIEW || !race_extent(tensor, &start, &end)) {
    return;
  }
  for (const Watch& watch : watches) {
    if (watch.impl != nullptr && (tensor.storage().unsafeGetStorageImpl() != watch.impl || watch.storage.expired())) {
      continue;
    }
    if (start < watch.end && watch.start < end && (watch.reads || use == WRITE)) {
      hits->push_back({watch.id, use == WRITE});
    }
  }
}

// A copy between host and device memory is the device's work, ordered by its stream (two copies into one pinned
// buffer on one stream never race): not a host access.
bool transfer(const at::RecordFunction& fn, c10::ArrayRef<const c10::IValue> inputs) {
  std::string_view name = fn.name();
  if (name == "aten::copy_") {
    for (const c10::IValue& value : inputs) {
      if (value.isTensor() && value.toTensor().defined() && !value.toTensor().is_cpu()) {
        return true;
      }
    }
  } else if (name == "aten::_to_copy" && inputs.size() > 3 && inputs[3].isDevice()) {
    return !inputs[3].toDevice().is_cpu();
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_call(const at::RecordFunction& fn) {
  std::vector<Hit> hits;
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (watches.empty()) {
      return nullptr;
    }
    const auto inputs = fn.inputs();
    if (transfer(fn, inputs)) {
      return nullptr;
    }
    const std::vector<int>& kinds = uses_of(fn);
    for (size_t i = 0; i < inputs.size(); ++i) {
      int use = i < kinds.size() ? kinds[i] : READ;
      const c10::IValue& value = inputs[i];
      if (value.isTensor()) {
        check(value.toTensor(), use, &hits);
      } else if (value.isTensorList()) {
        for (const at::Tensor& tensor : value.toTensorVector()) {
          check(tensor, use, &hits);
        }
      }
    }
    if (hits.empty() || !on_access) {
      return nullptr;
    }
    name = fn.name();
  }
  PyGILState_STATE state = PyGILState_Ensure();
  try {
    py::object callback;
    {
      std::lock_guard<std::mutex> lock(mutex);
      callback = on_access;
    }
    for (const Hit& hit : hits) {
      if (callback) {
        callback(hit.id, name, hit.wrote);
      }
    }
  } catch (py::error_already_set& error) {
    error.restore();  // the report is lost, the operator runs: Python prints it as unraisable
    PyErr_WriteUnraisable(nullptr);
  }
  PyGILState_Release(state);
  return nullptr;
}

void add(Watch watch) {
  std::lock_guard<std::mutex> lock(mutex);
  watches.push_back(std::move(watch));
  if (handle == 0) {
    handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_call)
                                       .scopes({at::RecordScope::FUNCTION})
                                       .needsInputs(true)
                                       .needsOutputs(false)
                                       .needsIds(false));
  }
}

void watch(int64_t id, uintptr_t start, uintptr_t end, bool reads) {
  add({id, start, end, reads});
}

// Stop watching `id` (-1: every range); the callback goes once nothing is watched.
void unwatch(int64_t id) {
  at::CallbackHandle removed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<Watch> kept;
    for (const Watch& watch : watches) {
      if (id != -1 && watch.id != id) {
        kept.push_back(watch);
      }
    }
    watches.swap(kept);
    if (watches.empty() && handle != 0) {
      removed = handle;
      handle = 0;
    }
  }
  if (removed != 0) {
    at::removeCallback(removed);
  }
}

void set_callback(py::object callback) {
  py::object old;
  {
    std::lock_guard<std::mutex> lock(mutex);
    old = on_access;
    on_access = callback.is_none() ? py::object() : callback;
  }
}  // the old callback is released here, outside the lock

}  // namespace race_watch

// Watch the host bytes of `host` (a copy's pinned tensor) under `id`, for accesses of its storage while it lives.
void race_watch_tensor(int64_t id, const at::Tensor& host, bool reads) {
  uintptr_t start = 0, end = 0;
  if (!race_extent(host, &start, &end)) {
    return;
  }
  race_watch::Watch watch{id, start, end, reads};
  watch.impl = host.storage().unsafeGetStorageImpl();
  watch.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(host.storage().getWeakStorageImpl());
  race_watch::add(std::move(watch));
}

// How many ranges are watched (kernels.cpp asks before it tells Python that the host waited for a stream).
size_t race_watched() {
  std::lock_guard<std::mutex> lock(race_watch::mutex);
  return race_watch::watches.size();
}

void bind_race_watch(py::module_& m) {
  m.def("race_watch", &race_watch::watch, "Watch host bytes [start, end) of an async copy: report reads (reads=True) and writes");
  m.def("race_unwatch", &race_watch::unwatch, "Stop watching a copy's bytes (-1: all)");
  m.def("race_callback", &race_watch::set_callback, "on_access(id, operator, wrote), or None");
  m.def("race_watched", &race_watched, "How many ranges are watched");
}
