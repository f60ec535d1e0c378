//! The workloads under zeronce, host policy `Immediate`.
use zeronce::{DiscardPolicy, ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().policy(DiscardPolicy::Immediate),
);

fn main() {
    zeronce_peers::main("zeronce-immediate");
}
