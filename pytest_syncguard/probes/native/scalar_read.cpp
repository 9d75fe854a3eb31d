// The sync probe's kernel for aten::_local_scalar_dense (.item(), bool(tensor), int(tensor)), in C++.
//
// A decoding loop reads a scalar once or twice per token, so this is the probe's hottest path. The Python
// kernel (probes/syncs.py) pays a boxed call into Python and back on every read, and Python bookkeeping with
// cold caches; this one reads the probe's state under the GIL and queues (code, instruction offset) pairs of
// the call site, plus the short stack above it the first time a site is seen. syncs.py turns the queue into
// events (drain) before anything else is recorded and whenever a recorder attaches or detaches. Counts, sites
// and stacks are the Python kernel's: tests/test_native.py compares the two.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#error "syncguard's native kernel needs Python 3.11 or newer (PyFrame_GetLasti)"
#endif

#include <ATen/core/dispatch/Dispatcher.h>
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

namespace {

// One frame of a call site: its code (kept alive by `verdicts`) and instruction offset in bytes (f_lasti).
struct Site {
  PyObject* code = nullptr;
  int lasti = 0;
};

// A counted read: its call site (code null when the whole stack is internal) and, for the first read from a
// site since the stacks were reset, the user frames above it.
struct Read {
  Site site;
  bool allowed = false;
  bool stacked = false;
  std::vector<Site> above;
};

// The probe's Python objects, set by install() and dropped by uninstall(); only touched under the GIL.
struct ProbeObjects {
  py::object probe;      // ._allowed: the depth of allow() blocks
  py::object local;      // this thread's .inside: the probe's own code is running
  py::object recorders;  // the attached recorders (a list): recorders[-1].on_device
  py::object signal;     // the copy signal: .muting, .mute(), .unmute()
  py::object timeline;   // .active: a profiler trace is being captured
  py::object annotate;   // annotate(frame) -> the trace annotation's context manager
  py::object is_user;    // is_user(code) -> whether the code lies outside torch and the plugin
  int depth = 5;         // frames in a short stack
};

std::unique_ptr<ProbeObjects> objects;
std::unique_ptr<torch::Library> library;
std::atomic<bool> armed{false};
// Code object -> lies outside torch and the plugin. Each code is kept (one reference) so its address stays its own.
std::unordered_map<PyObject*, bool> verdicts;
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
  PyObject* allowed = interned("_allowed");
  PyObject* inside = interned("inside");
  PyObject* on_device = interned("on_device");
  PyObject* muting = interned("muting");
  PyObject* mute = interned("mute");
  PyObject* unmute = interned("unmute");
  PyObject* active = interned("active");
  PyObject* enter = interned("__enter__");
  PyObject* exit = interned("__exit__");
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

void call_method(PyObject* owner, PyObject* name) {
  PyObject* result = PyObject_CallMethodNoArgs(owner, name);
  check(result != nullptr);
  Py_DECREF(result);
}

bool user_code(PyObject* code) {
  auto found = verdicts.find(code);
  if (found != verdicts.end()) {
    return found->second;
  }
  PyObject* result = PyObject_CallOneArg(objects->is_user.ptr(), code);
  check(result != nullptr);
  int verdict = PyObject_IsTrue(result);
  Py_DECREF(result);
  check(verdict >= 0);
  Py_INCREF(code);
  verdicts.emplace(code, verdict == 1);
  return verdict == 1;
}

// The first user frame from `frame` outwards (a new reference, or null), and its site. Consumes `frame`.
PyFrameObject* first_user_frame(PyFrameObject* frame, Site* site) {
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    bool user;
    try {
      user = user_code(reinterpret_cast<PyObject*>(code));
    } catch (...) {
      Py_DECREF(code);
      Py_DECREF(frame);
      throw;
    }
    Py_DECREF(code);  // still alive: `verdicts` holds it
    if (user) {
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

// Queue one counted read made from the current Python frame (none if the probe was removed meanwhile, by
// another thread, while this one waited for the device).
void record() {
  if (objects == nullptr) {
    return;
  }
  Read read;
  read.allowed = attribute_true(objects->probe.ptr(), names->allowed);
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  PyFrameObject* caller = first_user_frame(frame, &read.site);
  if (caller != nullptr) {
    read.stacked = stacked.emplace(read.site.code, read.site.lasti, read.allowed).second;
    PyFrameObject* above = read.stacked ? PyFrame_GetBack(caller) : nullptr;
    Py_DECREF(caller);
    while (above != nullptr && static_cast<int>(read.above.size()) < objects->depth - 1) {
      Site site;
      PyFrameObject* found = first_user_frame(above, &site);  // consumes `above`
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

// Whether this read counts: not the probe's own, a recorder attached, and on a device run a device tensor
// (reading a host tensor, a wrapped Python scalar say, costs a device run nothing).
bool counts(const at::Tensor& self) {
  if (objects == nullptr || attribute_true(objects->local.ptr(), names->inside)) {
    return false;
  }
  PyObject* recorders = objects->recorders.ptr();
  Py_ssize_t attached = PyList_GET_SIZE(recorders);
  if (attached == 0) {
    return false;
  }
  return !(self.is_cpu() && attribute_true(PyList_GET_ITEM(recorders, attached - 1), names->on_device));
}

// The trace annotation of a read while a profiler trace is captured (null otherwise), entered.
PyObject* annotation() {
  if (!attribute_true(objects->timeline.ptr(), names->active)) {
    return nullptr;
  }
  PyObject* frame = reinterpret_cast<PyObject*>(PyEval_GetFrame());
  PyObject* context = PyObject_CallOneArg(objects->annotate.ptr(), frame == nullptr ? Py_None : frame);
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

// Undo what a counted read changed: close its annotation and unmute, both always; the first error is raised.
// `signal` (owned, or null when not muted) is the copy signal the read muted: after the probe is removed its
// unmute does nothing, so a read that outlives its region cannot switch the warning back on.
void finish(PyObject* context, PyObject* signal) {
  std::exception_ptr error;
  try {
    close(context);
  } catch (...) {
    error = std::current_exception();
  }
  if (signal != nullptr) {
    try {
      call_method(signal, names->unmute);
    } catch (...) {
      if (!error) {
        error = std::current_exception();
      }
    }
    Py_DECREF(signal);
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

// Run the backend kernel; on its error, undo the read's changes (their own errors give way to it).
void redispatch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
                PyObject* context, PyObject* signal, bool take_gil) {
  try {
    op.redispatchBoxed(keys, stack);
  } catch (...) {
    std::unique_ptr<Gil> gil = take_gil ? std::make_unique<Gil>() : nullptr;
    try {
      finish(context, signal);
    } catch (...) {
      PyErr_Clear();
    }
    throw;
  }
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  keys = keys & after;
  const at::Tensor& self = stack->back().toTensor();
  if (!armed.load(std::memory_order_relaxed) || self.is_meta()) {
    op.redispatchBoxed(keys, stack);
    return;
  }
  if (self.is_cpu()) {
    // Reading host memory does not wait: one GIL hold around the whole call.
    Gil gil;
    if (!counts(self)) {
      op.redispatchBoxed(keys, stack);
      return;
    }
    PyObject* context = annotation();
    redispatch(op, keys, stack, context, nullptr, false);
    finish(context, nullptr);
    record();
    return;
  }
  // A device read waits for the device: the GIL is released meanwhile, and the runtime's sync warning is
  // muted (the copy signal would count this read again).
  bool counted = false;
  PyObject* signal = nullptr;
  PyObject* context = nullptr;
  {
    Gil gil;
    counted = counts(self);
    if (counted) {
      if (attribute_true(objects->signal.ptr(), names->muting)) {
        call_method(objects->signal.ptr(), names->mute);
        signal = objects->signal.ptr();
        Py_INCREF(signal);
      }
      try {
        context = annotation();
      } catch (...) {
        finish(nullptr, signal);
        throw;
      }
    }
  }
  if (!counted) {
    op.redispatchBoxed(keys, stack);
    return;
  }
  redispatch(op, keys, stack, context, signal, true);
  Gil gil;
  finish(context, signal);
  record();
}

void install(py::object probe, py::object local, py::list recorders, py::object signal, py::object timeline,
             py::object annotate, py::object is_user, int depth) {
  if (library != nullptr) {
    throw std::runtime_error("syncguard: the native scalar-read kernel is already installed");
  }
  if (names == nullptr) {
    names = std::make_unique<Names>();
  }
  objects = std::make_unique<ProbeObjects>(
      ProbeObjects{probe, local, recorders, signal, timeline, annotate, is_user, depth});
  try {
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::BackendSelect,
                                               __FILE__, __LINE__);
    library->impl("_local_scalar_dense", torch::CppFunction::makeFromBoxedFunction<&kernel>());
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

// The queued reads, oldest first, as (code or None, lasti, allowed, stack above or None); the queue is emptied.
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
    reads.append(py::make_tuple(code, read.site.lasti, read.allowed, above));
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "syncguard's native kernel for aten::_local_scalar_dense";
  m.def("install", &install, "Register the kernel; it reads the probe's objects and queues counted reads");
  m.def("uninstall", &uninstall, "Remove the kernel and drop the probe's objects (the queue is kept)");
  m.def("drain", &drain, "Take the queued reads: (code or None, lasti, allowed, stack above or None)");
  m.def("pending", [] { return pending.size(); }, "How many reads are queued");
  m.def("reset_stacks", [] { stacked.clear(); }, "Record the stack above each site again, from the next read on");
}
