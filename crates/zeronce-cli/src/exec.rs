//! `zeronce exec -- PROGRAM ARGS…`: runs a program with `libzeronce.so` preloaded, so its
//! large allocations come from zeronce's process mode (crate `zeronce-malloc`).

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Arguments of `zeronce exec`.
#[derive(clap::Args)]
pub struct ExecArgs {
    /// The program and its arguments (after `--`). The library is `ZERONCE_LIB`, else
    /// `libzeronce.so` beside this `zeronce` binary; the `ZERONCE_*` variables set it up.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Where the library is: `ZERONCE_LIB` (unless empty), else beside `exe`; it must be an
/// ELF file (anything else the dynamic loader skips with a warning, running the program
/// without zeronce).
fn library(exe: &Path, from_env: Option<OsString>) -> Result<PathBuf, String> {
    let (path, how) = match from_env.filter(|p| !p.is_empty()) {
        Some(p) => (PathBuf::from(p), "ZERONCE_LIB"),
        None => (
            exe.parent().unwrap_or(Path::new(".")).join("libzeronce.so"),
            "beside the zeronce binary",
        ),
    };
    if path.is_file() {
        let mut magic = [0u8; 4];
        let elf = std::fs::File::open(&path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && magic == *b"\x7fELF";
        if elf {
            Ok(path)
        } else {
            Err(format!(
                "{} ({how}) is not a shared library (no ELF header)",
                path.display()
            ))
        }
    } else {
        Err(format!(
            "{} ({how}) does not exist: build it with `cargo build --release` (it lands \
             beside target/release/zeronce) or set ZERONCE_LIB to its path",
            path.display()
        ))
    }
}

/// `lib` first in `LD_PRELOAD`, before what was there.
fn preload(lib: &Path, old: Option<&OsStr>) -> OsString {
    let mut v = lib.as_os_str().to_os_string();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Replaces this process with the program; returns only if that failed.
pub fn run(args: &ExecArgs) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let lib = library(&exe, std::env::var_os("ZERONCE_LIB"))?;
    let (program, rest) = args.command.split_first().ok_or("no program given")?;
    let ld_preload = preload(&lib, std::env::var_os("LD_PRELOAD").as_deref());
    let err = std::process::Command::new(program)
        .args(rest)
        .env("LD_PRELOAD", ld_preload)
        .exec();
    Err(format!("cannot run {}: {err}", Path::new(program).display()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_found_beside_the_binary_or_from_the_environment() {
        let dir = std::env::temp_dir().join(format!("zeronce-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("zeronce");
        let err = library(&exe, None).unwrap_err();
        assert!(
            err.contains("libzeronce.so (beside the zeronce binary) does not exist"),
            "{err}"
        );
        std::fs::write(dir.join("libzeronce.so"), b"root:x:0:0").unwrap();
        let err = library(&exe, None).unwrap_err();
        assert!(err.contains("is not a shared library"), "{err}");
        std::fs::write(dir.join("libzeronce.so"), b"\x7fELF\x02\x01").unwrap();
        assert_eq!(library(&exe, None), Ok(dir.join("libzeronce.so")));
        // An empty ZERONCE_LIB is no setting.
        assert_eq!(
            library(&exe, Some("".into())),
            Ok(dir.join("libzeronce.so"))
        );
        let err = library(&exe, Some("/nonexistent/lib.so".into())).unwrap_err();
        assert!(err.contains("/nonexistent/lib.so (ZERONCE_LIB)"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_library_goes_first_in_ld_preload() {
        let lib = Path::new("/x/libzeronce.so");
        assert_eq!(preload(lib, None), "/x/libzeronce.so");
        assert_eq!(preload(lib, Some(OsStr::new(""))), "/x/libzeronce.so");
        assert_eq!(
            preload(lib, Some(OsStr::new("/y/a.so"))),
            "/x/libzeronce.so:/y/a.so"
        );
    }
}
