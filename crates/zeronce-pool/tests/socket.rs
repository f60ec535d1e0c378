//! The pool daemon's socket (issue 20, the socket part; the rules are `zeronce-daemon`'s):
//! a stale socket is replaced, a live one refused (`InUse`), a path that is not a socket
//! refused and left alone, the socket is 0600 under umask 000, and a peer of another user
//! is closed. Needs a hugetlbfs mount of 2 MiB pages (`ZERONCE_HUGETLBFS_2M`) for the pool
//! behind it: ignored by a plain run, as the other pool tests.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use zeronce_mem::HugePageSize;
use zeronce_pool::client::Client;
use zeronce_pool::files::mount_from_env;
use zeronce_pool::server::{ServeError, Server};
use zeronce_pool::{Pool, PoolConfig, WorkerConfig};

fn pool(dir: &Path, state: PathBuf) -> Arc<Pool> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(
        Pool::start(PoolConfig {
            dir: dir.to_owned(),
            page_size: HugePageSize::Size2M,
            files: 1,
            file_bytes: 2 << 20,
            state_file: state,
            workers: WorkerConfig {
                threads: 0,
                ..WorkerConfig::default()
            },
            min_event_interval: Duration::from_millis(10),
        })
        .unwrap(),
    )
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn stale_replaced_live_and_files_refused_mode_0600() {
    let mount = mount_from_env().unwrap_or_else(|e| panic!("{e}"));
    let files = mount.join(format!("socket-{}", std::process::id()));
    let tmp = std::env::temp_dir().join(format!("zeronce-pool-socket-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let sock = tmp.join("pool.sock");
    let pool = pool(&files, tmp.join("state.json"));

    // A stale socket (bound, never listened on by anyone alive).
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let old = rustix::process::umask(rustix::fs::Mode::empty());
    let server = Server::bind(Arc::clone(&pool), &sock);
    rustix::process::umask(old);
    let server = server.expect("the stale socket is replaced");
    assert_eq!(sock.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    let stop = server.stop_handle();
    let thread = std::thread::spawn(move || server.run());

    let mut client = Client::connect(&sock).unwrap();
    assert!(client.stats().is_ok(), "served");
    let e = Server::bind(Arc::clone(&pool), &sock).unwrap_err();
    assert!(matches!(e, ServeError::InUse(_)), "{e}");
    let file = tmp.join("not-a-socket");
    std::fs::write(&file, b"keep").unwrap();
    let e = Server::bind(Arc::clone(&pool), &file).unwrap_err();
    assert!(matches!(e, ServeError::Bind(_)), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");

    stop.store(true, std::sync::atomic::Ordering::Release);
    drop(client);
    thread.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&files);
    std::fs::remove_dir_all(&tmp).unwrap();
}
