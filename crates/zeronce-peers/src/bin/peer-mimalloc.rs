//! The workloads under mimalloc (`mimalloc` crate).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    zeronce_peers::main("mimalloc");
}
