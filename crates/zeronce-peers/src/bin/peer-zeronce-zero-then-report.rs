//! The workloads under zeronce, host policy `ZeroThenReport { hold: std::time::Duration::from_secs(2) }`.
use zeronce::{HostPolicy, ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().policy(HostPolicy::ZeroThenReport {
        hold: std::time::Duration::from_secs(2),
    }),
);

fn main() {
    zeronce_peers::main("zeronce-zero-then-report");
}
