// The sync probe's native kernels, in C++: aten::_local_scalar_dense (.item(), bool(tensor), int(tensor)) and,
// on CUDA, aten::copy_ (host<->device transfers). They also tell the race probe (probes/races.py) of each
// non_blocking copy between pinned host memory and the device, and of each wait for the current stream while
// such a copy is watched (races.cpp).
//
// A decoding loop reads a scalar once or twice per token and calls copy_ several times per token, so these are
// the probe's hottest paths. The Python kernels (probes/syncs.py) pay a boxed call into Python and back on every
// call, and Python bookkeeping with cold caches; these decide in C++ whether the call waits for the device (a
// copy_ between two device tensors never takes the GIL), read the probe's state under the GIL only for the calls
// that count, and queue (code, instruction offset) pairs of the call site, plus the short stack above it the
// first time a site is seen. syncs.py turns the queue into events (drain) before anything else is recorded and
// whenever a recorder attaches or detaches. Counts, sites and stacks are the Python kernels': tests/test_native.py
// compares the two.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#error "syncguard's native kernel needs Python 3.11 or newer (PyFrame_GetLasti)"
#endif

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/copy_ops.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <atomic>
#include <exception>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

void bind_pm_samples(py::module_& m);                                     // samples.cpp
size_t race_watched();                                                     // races.cpp
void race_watch_tensor(int64_t id, const at::Tensor& host, bool reads);  // races.cpp
bool race_extent(const at::Tensor& tensor, uintptr_t* start, uintptr_t* end);  // races.cpp

namespace {

// One frame of a call site: its code (kept alive by `verdicts`) and instruction offset in bytes (f_lasti).
struct Site {
  PyObject* code = nullptr;
  int lasti = 0;
};

// A counted call: what it waited for, its call site (code null when the whole stack is internal) and, for the first read from a
// site since the stacks were reset, the user frames above it.
// What a counted call made the host wait for (syncs.py maps these to its SyncKind).
enum Wait : int { NONE = -1, SCALAR_READ = 0, BLOCKING_COPY = 1, PAGEABLE_COPY = 2 };

struct Read {
  Wait wait = SCALAR_READ;
  Site site;
  bool allowed = false;
  bool compiling = false;  // a frame of torch.compile's compiler lay between the call and its site
  bool stacked = false;
  std::vector<Site> above;
};

// The probe's Python objects, set by install() and dropped by uninstall(); only touched under the GIL.
struct ProbeObjects {
  py::object local;      // this thread's .inside (the probe's own code is running) and .allowed (allow() depth)
  py::object recorders;  // the attached recorders (a list): recorders[-1].on_device
  py::object timeline;   // .active: counted syncs are annotated (a profiler capture runs, or syncs are stamped)
  py::object annotate;   // annotate(frame, wait) -> the trace annotation's context manager
  py::object classify;   // classify(code) -> 0 internal, 1 user code (a call site), 2 torch.compile's compiler
  int depth = 5;         // frames in a short stack
  py::object races;      // the race probe (.active, copied(to_host, start, end, storage), waited()), or None
};

std::unique_ptr<ProbeObjects> objects;
std::unique_ptr<torch::Library> library;
std::atomic<bool> armed{false};
// Code object -> its class (see ProbeObjects::classify). Each code is kept (one reference) so its address stays its own.
enum CodeClass : int { INTERNAL = 0, USER = 1, COMPILER = 2 };
std::unordered_map<PyObject*, int> verdicts;
std::set<std::tuple<PyObject*, int, bool>> stacked;
std::vector<Read> pending;
const c10::DispatchKeySet after(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

PyObject* interned(const char* name) {
  PyObject* string = PyUnicode_InternFromString(name);
  if (string == nullptr) {
    throw py::error_already_set();
  }
  return string;
}

struct Names {
  PyObject* allowed = interned("allowed");
  PyObject* inside = interned("inside");
  PyObject* on_device = interned("on_device");
  PyObject* active = interned("active");
  PyObject* enter = interned("__enter__");
  PyObject* exit = interned("__exit__");
  PyObject* waited = interned("waited");
};
std::unique_ptr<Names> names;

class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

void check(bool ok) {
  if (!ok) {
    throw py::error_already_set();
  }
}

bool attribute_true(PyObject* owner, PyObject* name) {
  PyObject* value = PyObject_GetAttr(owner, name);
  check(value != nullptr);
  int verdict = PyObject_IsTrue(value);
  Py_DECREF(value);
  check(verdict >= 0);
  return verdict == 1;
}

int code_class(PyObject* code) {
  auto found = verdicts.find(code);
  if (found != verdicts.end()) {
    return found->second;
  }
  PyObject* result = PyObject_CallOneArg(objects->classify.ptr(), code);
  check(result != nullptr);
  long verdict = PyLong_AsLong(result);
  Py_DECREF(result);
  check(!(verdict == -1 && PyErr_Occurred()));
  Py_INCREF(code);
  verdicts.emplace(code, static_cast<int>(verdict));
  return static_cast<int>(verdict);
}

// The first user frame from `frame` outwards (a new reference, or null), and its site; `compiling` is set when a
// frame of torch.compile's compiler lies on the way (left alone otherwise). Consumes `frame`.
PyFrameObject* first_user_frame(PyFrameObject* frame, Site* site, bool* compiling) {
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    int verdict;
    try {
      verdict = code_class(reinterpret_cast<PyObject*>(code));
    } catch (...) {
      Py_DECREF(code);
      Py_DECREF(frame);
      throw;
    }
    Py_DECREF(code);  // still alive: `verdicts` holds it
    if (verdict == COMPILER && compiling != nullptr) {
      *compiling = true;
    }
    if (verdict == USER) {
      site->code = reinterpret_cast<PyObject*>(code);
      site->lasti = PyFrame_GetLasti(frame);
      return frame;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return nullptr;
}

// Queue one counted call made from the current Python frame (none if the probe was removed meanwhile, by
// another thread, while this one waited for the device).
void record(Wait wait) {
  if (objects == nullptr) {
    return;
  }
  Read read;
  read.wait = wait;
  read.allowed = attribute_true(objects->local.ptr(), names->allowed);
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  PyFrameObject* caller = first_user_frame(frame, &read.site, &read.compiling);
  if (caller != nullptr) {
    read.stacked = stacked.emplace(read.site.code, read.site.lasti, read.allowed).second;
    PyFrameObject* above = read.stacked ? PyFrame_GetBack(caller) : nullptr;
    Py_DECREF(caller);
    while (above != nullptr && static_cast<int>(read.above.size()) < objects->depth - 1) {
      Site site;
      PyFrameObject* found = first_user_frame(above, &site, nullptr);  // consumes `above`
      above = nullptr;
      if (found == nullptr) {
        break;
      }
      read.above.push_back(site);
      above = PyFrame_GetBack(found);
      Py_DECREF(found);
    }
    Py_XDECREF(above);
  }
  pending.push_back(std::move(read));
}

// Mark this thread as running the probe's own code (its calls inside are not counted), or not.
void set_inside(bool inside) {
  if (objects == nullptr) {
    return;  // removed meanwhile, by another thread
  }
  check(PyObject_SetAttr(objects->local.ptr(), names->inside, inside ? Py_True : Py_False) == 0);
}

// Whether a call counts: not the probe's own and a recorder attached.
bool recording() {
  if (objects == nullptr || attribute_true(objects->local.ptr(), names->inside)) {
    return false;
  }
  return PyList_GET_SIZE(objects->recorders.ptr()) > 0;
}

// Whether this read counts: recording, and on a device run a device tensor (reading a host tensor, a wrapped
// Python scalar say, costs a device run nothing).
bool counts(const at::Tensor& self) {
  if (!recording()) {
    return false;
  }
  PyObject* recorders = objects->recorders.ptr();
  PyObject* last = PyList_GET_ITEM(recorders, PyList_GET_SIZE(recorders) - 1);
  return !(self.is_cpu() && attribute_true(last, names->on_device));
}

// The trace annotation of a counted call while a profiler trace is captured (null otherwise), entered.
PyObject* annotation(Wait wait) {
  if (!attribute_true(objects->timeline.ptr(), names->active)) {
    return nullptr;
  }
  PyObject* frame = reinterpret_cast<PyObject*>(PyEval_GetFrame());
  PyObject* context = PyObject_CallFunction(objects->annotate.ptr(), "Oi", frame == nullptr ? Py_None : frame,
                                            static_cast<int>(wait));
  check(context != nullptr);
  PyObject* entered = PyObject_CallMethodNoArgs(context, names->enter);
  if (entered == nullptr) {
    Py_DECREF(context);
    throw py::error_already_set();
  }
  Py_DECREF(entered);
  return context;
}

void close(PyObject* context) {
  if (context == nullptr) {
    return;
  }
  PyObject* result = PyObject_CallMethodObjArgs(context, names->exit, Py_None, Py_None, Py_None, nullptr);
  Py_DECREF(context);
  check(result != nullptr);
  Py_DECREF(result);
}

// Run the backend kernel; on its error, close the call's annotation (its own error gives way to the first).
template <typename Run>
void redispatch(Run&& run, PyObject* context, bool take_gil) {
  try {
    run();
  } catch (...) {
    std::unique_ptr<Gil> gil = take_gil ? std::make_unique<Gil>() : nullptr;
    try {
      close(context);
    } catch (...) {
      PyErr_Clear();
    }
    throw;
  }
}

void host_waited();

void scalar_read(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  keys = keys & after;
  const at::Tensor& self = stack->back().toTensor();
  if (!armed.load(std::memory_order_relaxed) || self.is_meta()) {
    op.redispatchBoxed(keys, stack);
    return;
  }
  auto run = [&] { op.redispatchBoxed(keys, stack); };
  if (self.is_cpu()) {
    // Reading host memory does not wait: one GIL hold around the whole call.
    Gil gil;
    if (!counts(self)) {
      run();
      return;
    }
    PyObject* context = annotation(SCALAR_READ);
    redispatch(run, context, false);
    close(context);
    record(SCALAR_READ);
    return;
  }
  // A device read waits for the device: the GIL is released meanwhile. The probe's `inside` is set while it
  // runs, so that the CUDA calls it makes (a copy and a stream synchronize) are torch's, counted here once.
  bool counted = false;
  PyObject* context = nullptr;
  {
    Gil gil;
    counted = counts(self);
    if (counted) {
      context = annotation(SCALAR_READ);
      set_inside(true);
    }
  }
  if (!counted) {
    run();
    return;
  }
  try {
    redispatch(run, context, true);
  } catch (...) {
    Gil gil;
    set_inside(false);
    throw;
  }
  Gil gil;
  set_inside(false);
  close(context);
  record(SCALAR_READ);
  host_waited();
}

// The race probe learns that the host waited for the current stream (a device read or a blocking copy made it
// wait), when a non_blocking copy is being watched. Under the GIL.
void host_waited() {
  if (objects == nullptr || objects->races.is_none() || race_watched() == 0) {
    return;
  }
  PyObject* result = PyObject_CallMethodNoArgs(objects->races.ptr(), names->waited);
  check(result != nullptr);
  Py_DECREF(result);
}

// A non_blocking copy between pinned host memory and the device was queued: the race probe, when active, watches
// its host bytes until the host has waited for it.
void announce_async_copy(const at::Tensor& self, const at::Tensor& src) {
  Gil gil;
  if (objects == nullptr || objects->races.is_none() || !attribute_true(objects->races.ptr(), names->active)) {
    return;
  }
  bool to_host = self.is_cpu();
  const at::Tensor& host = to_host ? self : src;
  uintptr_t start = 0, end = 0;
  if (!race_extent(host, &start, &end)) {
    return;
  }
  auto storage = reinterpret_cast<uintptr_t>(host.storage().unsafeGetStorageImpl());
  PyObject* result = PyObject_CallMethod(objects->races.ptr(), "copied", "OKKK", to_host ? Py_True : Py_False,
                                         static_cast<unsigned long long>(start), static_cast<unsigned long long>(end),
                                         static_cast<unsigned long long>(storage));
  check(result != nullptr);
  long long ident = result == Py_None ? -1 : PyLong_AsLongLong(result);
  Py_DECREF(result);
  check(!(ident == -1 && PyErr_Occurred()));
  if (ident >= 0) {
    race_watch_tensor(ident, host, to_host);
  }
}

// What copy_(self, src, non_blocking) makes the host wait for: a blocking transfer between host and device
// memory always (memcpy_and_sync), a non_blocking one when its host memory is pageable (the driver stalls).
// The same rule as sync_ops._copy.
Wait copy_wait(const at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_cpu() == src.is_cpu() || self.is_meta() || src.is_meta() || self.numel() == 0) {
    return NONE;
  }
  if (!non_blocking) {
    return BLOCKING_COPY;
  }
  // What Tensor::is_pinned() answers, without dispatching aten::is_pinned: the probe adds no operator to those
  // it counts.
  const at::Tensor& host = self.is_cpu() ? self : src;
  return at::globalContext().isPinnedPtr(host.storage().data()) ? NONE : PAGEABLE_COPY;
}

at::Tensor& copy(c10::DispatchKeySet keys, at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  keys = keys & after;
  bool on = armed.load(std::memory_order_relaxed);
  Wait wait = on ? copy_wait(self, src, non_blocking) : NONE;
  if (wait == NONE) {
    at::_ops::copy_::redispatch(keys, self, src, non_blocking);
    // Between host and device, non_blocking and not waited for: pinned host memory (or nothing to copy).
    if (on && non_blocking && self.is_cpu() != src.is_cpu() && !self.is_meta() && !src.is_meta() && self.numel() > 0) {
      announce_async_copy(self, src);
    }
    return self;
  }
  // A copy that converts makes another copy_ inside (through a temporary): only the outermost counts, so the
  // probe's `inside` is set while it runs, as the Python kernels do.
  bool counted = false;
  PyObject* context = nullptr;
  {
    Gil gil;
    counted = recording();
    if (counted) {
      context = annotation(wait);
      set_inside(true);
    }
  }
  if (!counted) {
    return at::_ops::copy_::redispatch(keys, self, src, non_blocking);
  }
  try {
    redispatch([&] { at::_ops::copy_::redispatch(keys, self, src, non_blocking); }, context, true);
  } catch (...) {
    Gil gil;
    set_inside(false);
    throw;
  }
  Gil gil;
  set_inside(false);
  close(context);
  record(wait);
  if (wait == BLOCKING_COPY || self.is_cpu()) {  // a pageable copy to the host returns once it is done
    host_waited();
  }
  return self;
}

void install(py::object local, py::list recorders, py::object timeline, py::object annotate, py::object classify,
             int depth, bool copies, py::object races) {
  if (library != nullptr) {
    throw std::runtime_error("syncguard: the native kernels are already installed");
  }
  if (names == nullptr) {
    names = std::make_unique<Names>();
  }
  objects = std::make_unique<ProbeObjects>(ProbeObjects{local, recorders, timeline, annotate, classify, depth, races});
  try {
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::BackendSelect,
                                               __FILE__, __LINE__);
    library->impl("_local_scalar_dense", torch::CppFunction::makeFromBoxedFunction<&scalar_read>());
    if (copies) {
      library->impl("copy_", TORCH_FN(copy));
    }
  } catch (...) {
    library.reset();
    objects.reset();
    throw;
  }
  armed = true;
}

py::tuple site_tuple(const Site& site) {
  return py::make_tuple(py::reinterpret_borrow<py::object>(site.code), site.lasti);
}

// The queued calls, oldest first, as (wait, code or None, lasti, allowed, compiling, stack above or None); the queue
// is emptied.
py::list drain() {
  py::list reads;
  for (const Read& read : pending) {
    py::object code = read.site.code == nullptr ? py::none() : py::reinterpret_borrow<py::object>(read.site.code);
    py::object above = py::none();
    if (read.stacked) {
      py::tuple frames(read.above.size());
      for (size_t i = 0; i < read.above.size(); ++i) {
        frames[i] = site_tuple(read.above[i]);
      }
      above = frames;
    }
    reads.append(py::make_tuple(static_cast<int>(read.wait), code, read.site.lasti, read.allowed, read.compiling, above));
  }
  pending.clear();
  return reads;
}

void uninstall() {
  armed = false;
  library.reset();  // deregisters the kernel
  objects.reset();
}

}  // namespace

void bind_op_counter(py::module_& m);  // ops.cpp
void bind_race_watch(py::module_& m);  // races.cpp
void bind_launch_log(py::module_& m);  // launches.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "syncguard's native kernels for aten::_local_scalar_dense and aten::copy_, its operator counter and "
          "the PM sampler's decode loop and the launch log";
  bind_op_counter(m);
  bind_race_watch(m);
  bind_pm_samples(m);
  bind_launch_log(m);
  m.def("install", &install, "Register the kernels (copy_ with copies=True); they queue the calls that count");
  m.def("uninstall", &uninstall, "Remove the kernels and drop the probe's objects (the queue is kept)");
  m.def("drain", &drain, "Take the queued calls: (wait, code or None, lasti, allowed, compiling, stack above or None)");
  m.def("pending", [] { return pending.size(); }, "How many calls are queued");
  m.def("reset_stacks", [] { stacked.clear(); }, "Record the stack above each site again, from the next read on");
}
