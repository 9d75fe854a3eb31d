// The extension as one translation unit: torch's headers are parsed once, not once per source (on the 2-core
// machine 16 s of CPU instead of 39 s). Each source keeps its own names in a namespace of its own.
#include "kernels.cpp"
#include "launches.cpp"
#include "ops.cpp"
#include "races.cpp"
#include "samples.cpp"
