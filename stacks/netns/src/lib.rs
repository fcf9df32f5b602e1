//! Network-namespace test harness for uniplane's multi-server tests (in progress).
