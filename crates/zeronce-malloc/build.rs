//! Link flags for `libzeronce.so`.

fn main() {
    // Never unmapped by `dlclose`: its blocks may still be live in the program, its
    // reporting and zeroing threads still running, and its `fork` handlers registered.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
