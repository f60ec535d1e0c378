//! The `zeronce-vhost` program: clear errors for unusable socket paths, and a clean exit
//! (sockets removed) on SIGINT / SIGTERM.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zeronce-vhost"))
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn serve_error(socket: &std::path::Path) -> String {
    let out = bin()
        .arg("serve")
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{socket:?} must be refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unusable_socket_paths_are_refused_with_the_reason() {
    let d = dir("paths");
    let taken = d.join("taken");
    std::fs::write(&taken, b"").unwrap();
    assert!(serve_error(&taken).contains("is not a socket"));
    assert!(serve_error(&d.join("a:b")).contains("contains ':'"));
    assert!(serve_error(&d.join("x".repeat(110))).contains("at most 107"));
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "nothing created");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sigterm_and_sigint_stop_the_daemon_cleanly() {
    use rustix::process::{kill_process, Pid, Signal};
    let d = dir("signals");
    for sig in [Signal::TERM, Signal::INT] {
        let socket = d.join("s.sock");
        let mut child = bin()
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("listening"), "{line:?}");
        // A connected front-end does not keep it from stopping.
        let _frontend = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        kill_process(Pid::from_raw(child.id() as i32).unwrap(), sig).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{sig:?}: {status}");
        assert!(
            !socket.exists() && !d.join("s.sock.ctl").exists(),
            "{sig:?}: sockets removed"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}
