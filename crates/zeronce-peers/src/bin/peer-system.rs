//! The workloads under glibc's malloc (`System`).
fn main() {
    zeronce_peers::main("glibc");
}
