// The PM sampler's decode loop (probes/pm_sampling.py), in C++: per sample, CUPTI's sample info (its start and end
// on the GPU's timer) and the evaluation of its counters, for the million samples of a second of device time. In
// Python each sample cost two ctypes calls and their bookkeeping, about 7 us; here the loop runs without the GIL.
//
// Nothing of CUPTI is compiled in: Python builds the parameter structs with ctypes (one source for their layout)
// and passes their addresses, the offsets of the fields the loop writes and reads, and the addresses of the two
// CUPTI functions in the libcupti it loaded. The evaluation can be split over threads, each with a host object
// and a parameter struct of its own; the sample info is read on the calling thread.
//
// compact_samples merges runs of touching samples that read wholly active, or idle, into one row each (their
// cycles added): the sampled timeline's analysis places idle time only in the other samples and beside idle ones,
// so a run of either kind reads as one sample of it (analysis/sampled.py; tests/test_pm_decode.py compares both).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace pm_samples {

using CuptiCall = int (*)(void*);

template <typename T>
T* field(uintptr_t base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

// Where a decode stopped: the CUPTI call that failed, its status and the sample it was at (status 0: none failed).
using Outcome = std::tuple<int, std::string, size_t>;

// One thread's share of the evaluation: samples [first, last) into the value columns.
Outcome evaluate(CuptiCall call, uintptr_t params, size_t range_offset, const double* values, size_t metrics,
                 size_t first, size_t last, const std::vector<double*>& columns) {
  for (size_t index = first; index < last; ++index) {
    *field<size_t>(params, range_offset) = index;
    int status = call(reinterpret_cast<void*>(params));
    if (status != 0) {
      return {status, "cuptiProfilerHostEvaluateToGpuValues", index};
    }
    for (size_t metric = 0; metric < metrics; ++metric) {
      columns[metric][index] = values[metric];
    }
  }
  return {0, "", last};
}

// Decode `count` samples into `starts` and `ends` (int64) and one double column per metric. `info` is the
// cuptiPmSamplingCounterDataGetSampleInfo params (sampleIndex, startTimestamp, endTimestamp at the offsets given);
// each of `evaluations` a cuptiProfilerHostEvaluateToGpuValues params (rangeIndex at `range_offset`) whose metric
// values land in the buffer of the same position in `values`.
Outcome decode(uintptr_t info_call, uintptr_t evaluate_call, uintptr_t info, size_t index_offset,
               size_t start_offset, size_t end_offset, const std::vector<uintptr_t>& evaluations,
               size_t range_offset, const std::vector<uintptr_t>& values, size_t metrics, size_t count,
               uintptr_t starts, uintptr_t ends, const std::vector<uintptr_t>& column_addresses) {
  if (evaluations.empty() || evaluations.size() != values.size() || column_addresses.size() != metrics) {
    throw std::invalid_argument("decode: one values buffer per evaluation and one column per metric");
  }
  std::vector<double*> columns;
  for (uintptr_t address : column_addresses) {
    columns.push_back(reinterpret_cast<double*>(address));
  }
  auto* start_out = reinterpret_cast<int64_t*>(starts);
  auto* end_out = reinterpret_cast<int64_t*>(ends);
  auto get_info = reinterpret_cast<CuptiCall>(info_call);
  auto evaluate_one = reinterpret_cast<CuptiCall>(evaluate_call);
  py::gil_scoped_release released;
  for (size_t index = 0; index < count; ++index) {
    *field<size_t>(info, index_offset) = index;
    int status = get_info(reinterpret_cast<void*>(info));
    if (status != 0) {
      return {status, "cuptiPmSamplingCounterDataGetSampleInfo", index};
    }
    start_out[index] = static_cast<int64_t>(*field<uint64_t>(info, start_offset));
    end_out[index] = static_cast<int64_t>(*field<uint64_t>(info, end_offset));
  }
  size_t threads = evaluations.size();
  size_t chunk = (count + threads - 1) / threads;
  std::vector<Outcome> outcomes(threads, Outcome{0, "", 0});
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    size_t first = std::min(count, t * chunk), last = std::min(count, first + chunk);
    workers.emplace_back([&, t, first, last] {
      outcomes[t] = evaluate(evaluate_one, evaluations[t], range_offset,
                             reinterpret_cast<const double*>(values[t]), metrics, first, last, columns);
    });
  }
  outcomes[0] = evaluate(evaluate_one, evaluations[0], range_offset, reinterpret_cast<const double*>(values[0]),
                         metrics, 0, std::min(count, chunk), columns);
  for (auto& worker : workers) {
    worker.join();
  }
  for (const auto& outcome : outcomes) {
    if (std::get<0>(outcome) != 0) {
      return outcome;
    }
  }
  return {0, "", count};
}

// A sample's kind for compaction: wholly active, idle, or partly active (never merged; nor one without cycles).
enum Kind { PARTLY = 0, FULL = 1, IDLE = 2 };

Kind kind_of(double active, double elapsed, double idle_below) {
  if (!(elapsed > 0)) {
    return PARTLY;  // no cycles elapsed: kept as it is
  }
  double fraction = active / elapsed;
  if (fraction >= 1.0) {
    return FULL;
  }
  return fraction < idle_below ? IDLE : PARTLY;
}

// Merge, in place, each run of touching samples (one's end is the next's start) of the same kind, FULL or IDLE,
// into its first row: its end becomes the run's last end, its cycles the run's sums. Returns the rows kept.
size_t compact(uintptr_t starts, uintptr_t ends, uintptr_t active, uintptr_t elapsed, size_t count,
               double idle_below) {
  auto* start = reinterpret_cast<int64_t*>(starts);
  auto* end = reinterpret_cast<int64_t*>(ends);
  auto* on = reinterpret_cast<double*>(active);
  auto* all = reinterpret_cast<double*>(elapsed);
  py::gil_scoped_release released;
  size_t kept = 0;
  Kind last = PARTLY;
  for (size_t index = 0; index < count; ++index) {
    Kind kind = kind_of(on[index], all[index], idle_below);
    if (kept > 0 && kind != PARTLY && kind == last && start[index] == end[kept - 1]) {
      end[kept - 1] = end[index];
      on[kept - 1] += on[index];
      all[kept - 1] += all[index];
      continue;
    }
    start[kept] = start[index];
    end[kept] = end[index];
    on[kept] = on[index];
    all[kept] = all[index];
    last = kind;
    ++kept;
  }
  return kept;
}

}  // namespace pm_samples

void bind_pm_samples(py::module_& m) {
  m.def("pm_decode", &pm_samples::decode,
        "Decode PM samples into arrays: (status, failed call, sample index); status 0 when every call succeeded");
  m.def("pm_compact", &pm_samples::compact, "Merge touching wholly active or idle samples in place; returns the rows kept");
}
