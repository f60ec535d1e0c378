//! The workloads under jemalloc (`tikv-jemallocator`).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    zeronce_peers::main("jemalloc");
}
