//! The workloads under zeronce, host policy `Lazy`.
use zeronce::{DiscardPolicy, ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> = ZeronceAlloc::new(
    std::alloc::System,
    ProcessBackend::new().policy(DiscardPolicy::Lazy),
);

fn main() {
    zeronce_peers::main("zeronce-lazy");
}
