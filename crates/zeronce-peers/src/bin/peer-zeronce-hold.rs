//! The workloads under zeronce, host policy `Hold(std::time::Duration::from_secs(2))`.
use zeronce::{DiscardPolicy, ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().policy(DiscardPolicy::Hold(std::time::Duration::from_secs(2))),
);

fn main() {
    zeronce_peers::main("zeronce-hold");
}
