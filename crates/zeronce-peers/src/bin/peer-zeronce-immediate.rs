//! The workloads under zeronce, host policy `Immediate`.
use zeronce::{HostPolicy, ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().policy(HostPolicy::Immediate),
);

fn main() {
    zeronce_peers::main("zeronce-immediate");
}
