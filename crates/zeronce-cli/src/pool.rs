//! `zeronce pool ...`: the pre-zeroed hugetlbfs file pool daemon and its client verbs
//! (thin layer over `zeronce-pool`; the protocol is in `docs/POOL_PROTOCOL.md`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use zeronce_daemon::endpoint::{parse_metrics_addr, MetricsAddr};
use zeronce_daemon::AccessArgs;
use zeronce_mem::HugePageSize;
use zeronce_pool::client::{Client, TakeOptions};
use zeronce_pool::server::{Limits, Server};
use zeronce_pool::{parse_cpu_list, Pool, PoolConfig, WorkerConfig};
use zeronce_types::size::parse_size;

/// Default control socket.
const SOCKET: &str = "/run/zeronce/pool.sock";

/// The pool verbs.
#[derive(Subcommand)]
pub enum PoolCmd {
    /// Run the daemon: N pre-zeroed files of size S on a hugetlbfs mount.
    Serve(Box<ServeArgs>),
    /// Take a pre-zeroed file; prints its path (or, with --fd, runs a command holding
    /// its descriptor).
    Take(TakeArgs),
    /// Give a file back (the daemon re-zeroes it once no process has it open or mapped).
    Return {
        /// The path `take` printed.
        path: PathBuf,
        /// The token `take` printed (on stderr): only the file's taker may return it.
        #[arg(long, env = "ZERONCE_POOL_TOKEN")]
        token: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Page counts, counters and zeroing rate (JSON).
    Stats {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Zero up to N zeroable pages now.
    Prezero {
        /// Pages.
        pages: u64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Print "zeroable pages appeared" events (rate-limited) as JSON lines.
    Watch {
        #[command(flatten)]
        socket: SocketArg,
    },
}

/// The control socket option of every verb.
#[derive(Args, Clone, Debug)]
pub struct SocketArg {
    /// The daemon's control socket.
    #[arg(long, default_value = SOCKET, env = "ZERONCE_POOL_SOCKET")]
    pub socket: PathBuf,
}

/// `zeronce pool serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A hugetlbfs mount of --page-size pages (the daemon mounts nothing).
    #[arg(long)]
    pub dir: PathBuf,
    /// Huge page size: 2M or 1G.
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    pub page_size: HugePageSize,
    /// Number of files.
    #[arg(long)]
    pub files: usize,
    /// Size of each file (e.g. 512M, 4G): a multiple of the page size.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    #[command(flatten)]
    pub socket: SocketArg,
    /// The state file (crash safety; not on hugetlbfs).
    #[arg(long, default_value = "/run/zeronce/pool.state")]
    pub state: PathBuf,
    /// Zeroing worker threads (0: zero only on `prezero` and on takes).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// CPUs the workers may run on (e.g. 2-3,6).
    #[arg(long, value_parser = parse_cpu_list)]
    pub cpus: Option<Vec<usize>>,
    /// Nice value of the workers (e.g. 19).
    #[arg(long, allow_negative_numbers = true)]
    pub nice: Option<i32>,
    /// Cap on zeroing bandwidth, bytes per second (e.g. 4G).
    #[arg(long, value_parser = parse_size)]
    pub max_rate: Option<u64>,
    /// Least time between two "zeroable pages appeared" events, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub event_interval_ms: u64,
    /// Client connections served at once (one more is refused with one error line).
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Client connections one process may have served at once (one more is refused
    /// with one error line naming the process).
    #[arg(long, default_value_t = Limits::default().max_per_pid)]
    pub max_connections_per_pid: usize,
    /// Connections one user (uid) may have served at once: one user's many processes
    /// cannot take every slot from the others.
    #[arg(long, default_value_t = Limits::default().max_per_uid)]
    pub max_connections_per_uid: usize,
    /// A connection holding no file that sends no request for this long is closed,
    /// milliseconds.
    #[arg(long, default_value_t = Limits::default().idle_timeout.as_millis() as u64)]
    pub idle_timeout_ms: u64,
    /// Who may connect to the control socket.
    #[command(flatten)]
    pub access: AccessArgs,
    /// Serve the counters as a Prometheus page (HTTP GET) on this unix socket path or
    /// loopback address (127.0.0.1:PORT); off by default.
    #[arg(long, value_parser = parse_metrics_addr)]
    pub metrics: Option<MetricsAddr>,
}

/// `zeronce pool take`.
#[derive(Args, Debug)]
pub struct TakeArgs {
    /// Bytes needed (e.g. 512M).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Wait for a file being zeroed when none is free.
    #[arg(long)]
    pub wait: bool,
    /// Receive the file's descriptor (SCM_RIGHTS) and run COMMAND with it inherited:
    /// `{fd}` in its arguments becomes the descriptor number, and ZERONCE_POOL_FD is set.
    #[arg(long, requires = "command")]
    pub fd: bool,
    /// With --fd: tie the file to this command's life instead of an explicit return.
    /// When this process ends (the command exited, or this process was killed) without
    /// a return, the daemon reclaims the file once no process has it open or mapped any
    /// more (a VMM the command started keeps it while it runs).
    #[arg(long, requires = "fd")]
    pub lease: bool,
    #[command(flatten)]
    pub socket: SocketArg,
    /// The command to run with --fd.
    #[arg(last = true)]
    pub command: Vec<String>,
}

fn parse_page_size(text: &str) -> Result<HugePageSize, String> {
    match parse_size(text)? {
        n if n == HugePageSize::Size2M.bytes() as u64 => Ok(HugePageSize::Size2M),
        n if n == HugePageSize::Size1G.bytes() as u64 => Ok(HugePageSize::Size1G),
        _ => Err(format!("{text:?}: huge pages are 2M or 1G")),
    }
}

/// Error type of the verbs: a message for the user.
pub type PoolResult = Result<(), Box<dyn std::error::Error>>;

/// Runs one verb.
pub fn run(cmd: PoolCmd) -> PoolResult {
    match cmd {
        PoolCmd::Serve(args) => serve(*args),
        PoolCmd::Take(args) => take(&args),
        PoolCmd::Return {
            path,
            token,
            socket,
        } => {
            let v = connect(&socket.socket)?.return_file(&path, token.as_deref())?;
            if v["in_use"] == true {
                eprintln!(
                    "zeronce pool: {} is still open or mapped by process {}: the daemon zeroes it once no process uses it",
                    path.display(),
                    v["used_by"]
                );
            }
            Ok(())
        }
        PoolCmd::Stats { socket } => {
            let v = connect(&socket.socket)?.stats()?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        PoolCmd::Prezero { pages, socket } => {
            let v = connect(&socket.socket)?.prezero(pages)?;
            println!("{v}");
            Ok(())
        }
        PoolCmd::Watch { socket } => {
            let mut client = connect(&socket.socket)?;
            client.watch()?;
            loop {
                let (event, _) = client.read_reply()?;
                println!("{event}");
            }
        }
    }
}

fn connect(socket: &Path) -> Result<Client, Box<dyn std::error::Error>> {
    Client::connect(socket).map_err(|e| format!("{e} (is `zeronce pool serve` running?)").into())
}

fn serve(args: ServeArgs) -> PoolResult {
    if let Some(dir) = args.state.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let config = PoolConfig {
        dir: args.dir,
        page_size: args.page_size,
        files: args.files,
        file_bytes: args.size,
        state_file: args.state,
        workers: WorkerConfig {
            threads: args.workers,
            cpus: args.cpus.unwrap_or_default(),
            nice: args.nice,
            max_bytes_per_sec: args.max_rate,
        },
        min_event_interval: Duration::from_millis(args.event_interval_ms),
    };
    let pool = Arc::new(Pool::start(config)?);
    let limits = Limits {
        max_connections: args.max_connections,
        max_per_pid: args.max_connections_per_pid,
        max_per_uid: args.max_connections_per_uid,
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
        ..Limits::default()
    };
    let mut server =
        Server::bind_with(pool, &args.socket.socket, &args.access.access())?.with_limits(limits);
    if let Some(addr) = &args.metrics {
        server = server.with_metrics(addr)?;
    }
    server.stop_on_signals()?;
    eprintln!(
        "zeronce pool: serving on {} (SIGINT/SIGTERM to stop)",
        args.socket.socket.display()
    );
    server.run()?;
    Ok(())
}

fn take(args: &TakeArgs) -> PoolResult {
    let mut client = connect(&args.socket.socket)?;
    let how = TakeOptions {
        fd: args.fd,
        wait: args.wait,
        lease: args.lease,
    };
    let taken = client.take(args.size, how)?;
    let path = taken.path.display();
    if !args.fd {
        println!("{path}");
        eprintln!(
            "zeronce pool: token {0}: `zeronce pool return {path} --token {0}` gives it back",
            taken.token
        );
        return Ok(());
    }
    let fd: OwnedFd = taken
        .fd
        .ok_or("the daemon did not pass a descriptor (see its log)")?;
    // An inheritable copy (received descriptors are close-on-exec).
    let inherited = rustix::io::dup(&fd)?;
    let n = inherited.as_raw_fd().to_string();
    let (program, rest) = args.command.split_first().ok_or("--fd needs a command")?;
    let status = std::process::Command::new(program)
        .args(rest.iter().map(|a| a.replace("{fd}", &n)))
        .env("ZERONCE_POOL_FD", &n)
        .env("ZERONCE_POOL_PATH", &taken.path)
        .env("ZERONCE_POOL_TOKEN", &taken.token)
        .status()?;
    if args.lease {
        eprintln!(
            "zeronce pool: lease on {path} ends; the daemon reclaims it once no process uses it"
        );
    } else {
        eprintln!(
            "zeronce pool: {path} stays taken; `zeronce pool return {path} --token {}` gives it back",
            taken.token
        );
    }
    if !status.success() {
        return Err(format!("{program} exited with {status}").into());
    }
    Ok(())
}
