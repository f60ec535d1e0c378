//! What the library says on stderr: one line, written straight to the descriptor
//! (nothing here allocates through the exported `malloc`), and the abort on a pointer the
//! allocator never handed out.

use std::io::Write;

/// Writes `line` to stderr, ignoring failure (nobody to tell).
pub fn write_stderr(line: &[u8]) {
    let _ = std::io::stderr().write_all(line);
}

/// One line on stderr and `abort()`, as glibc does for a pointer it never handed out.
pub fn bad_pointer(call: &str, addr: usize) -> ! {
    write_stderr(
        format!(
            "zeronce: {call}(): invalid pointer {addr:#x}: not a live allocation (a double free, or a pointer the allocator never handed out)\n"
        )
        .as_bytes(),
    );
    std::process::abort()
}
