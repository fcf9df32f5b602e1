//! uniplane-bench: the packet generator and benchmarks (work in progress).
