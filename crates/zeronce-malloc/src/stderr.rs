//! What the library says on stderr: one line, written straight to the descriptor
//! (nothing here allocates through the exported `malloc`), and the abort on a pointer the
//! allocator never handed out.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::OnceLock;

/// Writes `line` to stderr, ignoring failure (nobody to tell).
pub fn write_stderr(line: &[u8]) {
    let _ = std::io::stderr().write_all(line);
}

/// A copy of stderr kept for the exit report, with its file's identity: programs such as
/// `xz`, `sort` and the other coreutils close stderr in an `atexit` handler (to check it
/// for write errors), before this library's destructor writes the report.
static REPORT_TO: OnceLock<Option<(File, (u64, u64))>> = OnceLock::new();

/// The lowest descriptor the copy may take: well above the ones programs pick by
/// number (shells use 10 and up for redirections, 255 for themselves).
const REPORT_FD_MIN: i32 = 300;

fn identity(f: impl AsFd) -> Option<(u64, u64)> {
    rustix::fs::fstat(f).ok().map(|st| (st.st_dev, st.st_ino))
}

/// Keeps a close-on-exec copy of stderr for [`write_report`] (once; a failure leaves the
/// report to stderr itself).
pub fn keep_stderr_for_report() {
    REPORT_TO.get_or_init(|| {
        let copy = rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), REPORT_FD_MIN).ok()?;
        let id = identity(&copy)?;
        Some((File::from(copy), id))
    });
}

/// Writes the exit report to the copy of stderr if it still is the file it was (the
/// program may have closed stderr; a descriptor reused for another file is not written),
/// else to stderr.
pub fn write_report(text: &[u8]) {
    match REPORT_TO.get() {
        Some(Some((file, id))) if identity(file) == Some(*id) => {
            let _ = (&*file).write_all(text);
        }
        _ => write_stderr(text),
    }
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
