//! The workloads under zeronce, the zero-once lifecycle (`zero_then_report`, 2 s hold).
use zeronce::{ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().zero_then_report(std::time::Duration::from_secs(2)),
);

fn main() {
    zeronce_peers::main("zeronce-zero-then-report");
}
