//! The opt-in metrics endpoint of a daemon: HTTP `GET` answered with the Prometheus text
//! page ([`crate::prometheus`]), on a unix socket (bound like the daemon's own, with its
//! mode: `curl --unix-socket PATH http://x/metrics`) or a loopback TCP port
//! (`127.0.0.1:9101`; other addresses are refused, the page is not for the network).
//! One connection at a time, each bounded (8 KiB of request, 2 s to send it and to take
//! the answer), so a slow scraper cannot hold the daemon.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::socket::{bind, BindError, SocketOptions};

/// Where the metrics are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A unix socket path.
    Unix(PathBuf),
    /// A loopback TCP address.
    Tcp(SocketAddr),
}

/// Reads `--metrics`: an `IP:PORT` on the loopback, or a unix socket path.
pub fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    match s.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_loopback() => Ok(MetricsAddr::Tcp(a)),
        Ok(a) => Err(format!(
            "{a}: metrics are served on the loopback only (127.0.0.1:PORT) or a unix socket"
        )),
        Err(_) if s.is_empty() => Err("an empty metrics address".into()),
        Err(_) => Ok(MetricsAddr::Unix(PathBuf::from(s))),
    }
}

#[derive(Debug)]
enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// A bound metrics endpoint; a unix socket is removed when it is dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    listener: Listener,
}

/// Longest request read.
const MAX_REQUEST: u64 = 8 << 10;
/// Time a scraper has to send its request and to take the answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

impl MetricsEndpoint {
    /// Binds `addr` (a unix socket with `options`, like the daemon's own sockets).
    pub fn bind(addr: &MetricsAddr, options: &SocketOptions) -> Result<Self, BindError> {
        let listener = match addr {
            MetricsAddr::Unix(p) => Listener::Unix(bind(p, options)?, p.clone()),
            MetricsAddr::Tcp(a) => {
                Listener::Tcp(TcpListener::bind(a).map_err(|source| BindError::Io {
                    path: PathBuf::from(a.to_string()),
                    what: "bind",
                    source,
                })?)
            }
        };
        Ok(MetricsEndpoint { listener })
    }

    /// The TCP address bound (port 0 becomes the one the kernel chose).
    pub fn local_tcp_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match &self.listener {
            Listener::Unix(l, _) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }

    /// Answers scrapes with `render()` until `stopping()` (checked every 200 ms).
    pub fn serve(&self, stopping: impl Fn() -> bool, render: impl Fn() -> String) {
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        let mut backoff = crate::AcceptBackoff::new("metrics");
        while !stopping() {
            let fd = self.fd();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            if poll(&mut fds, Some(&tick)).unwrap_or(0) == 0 {
                continue;
            }
            let answered = match &self.listener {
                Listener::Unix(l, _) => l.accept().and_then(|(s, _)| answer(s, &render)),
                Listener::Tcp(l) => l.accept().and_then(|(s, _)| answer(s, &render)),
            };
            match answered {
                Ok(()) => backoff.succeeded(),
                Err(e) if is_client_error(&e) => {}
                Err(e) => std::thread::sleep(backoff.failed(&e)),
            }
        }
    }
}

/// A scraper's own failure (too slow, gone): nothing to back off from.
fn is_client_error(e: &io::Error) -> bool {
    use io::ErrorKind as K;
    matches!(
        e.kind(),
        K::WouldBlock | K::TimedOut | K::BrokenPipe | K::ConnectionReset | K::UnexpectedEof
    )
}

/// Reads the request head (up to a blank line, at most [`MAX_REQUEST`], within
/// [`SCRAPE_TIMEOUT`]) and answers.
fn answer<S>(mut s: S, render: &impl Fn() -> String) -> io::Result<()>
where
    S: Read + Write + AsFd,
{
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    set_socket_timeout(&s, Timeout::Recv, Some(SCRAPE_TIMEOUT))?;
    set_socket_timeout(&s, Timeout::Send, Some(SCRAPE_TIMEOUT))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let mut limited = (&mut s).take(MAX_REQUEST);
    while !head.ends_with(b"\r\n\r\n") && !head.ends_with(b"\n\n") {
        if limited.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let (status, body) = if head.starts_with(b"GET ") {
        ("200 OK", render())
    } else {
        ("405 Method Not Allowed", "only GET\n".to_owned())
    };
    write!(
        s,
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = &self.listener {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Fetches the page at `addr` the way a scraper does (for tests and `curl`-less checks).
pub fn scrape(addr: &MetricsAddr) -> io::Result<String> {
    fn get<S: Read + Write>(mut s: S) -> io::Result<String> {
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut text = String::new();
        s.take(16 << 20).read_to_string(&mut text)?;
        Ok(text)
    }
    let text = match addr {
        MetricsAddr::Unix(p) => get(std::os::unix::net::UnixStream::connect(p)?)?,
        MetricsAddr::Tcp(a) => get(std::net::TcpStream::connect(a)?)?,
    };
    let body = text
        .split_once("\r\n\r\n")
        .filter(|(head, _)| head.starts_with("HTTP/1.0 200"))
        .map(|(_, body)| body.to_owned());
    body.ok_or_else(|| io::Error::other(format!("not a metrics page: {text:?}")))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn loopback_and_paths_are_accepted_other_addresses_refused() {
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9101"),
            Ok(MetricsAddr::Tcp("127.0.0.1:9101".parse().unwrap()))
        );
        assert!(parse_metrics_addr("0.0.0.0:9101").is_err());
        assert_eq!(
            parse_metrics_addr("/run/z.metrics"),
            Ok(MetricsAddr::Unix("/run/z.metrics".into()))
        );
    }

    #[test]
    fn both_kinds_serve_the_page() {
        let dir = std::env::temp_dir().join(format!("zeronce-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stop = AtomicBool::new(false);
        for addr in [
            MetricsAddr::Unix(dir.join("m.sock")),
            MetricsAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        ] {
            let e = MetricsEndpoint::bind(&addr, &SocketOptions::default()).unwrap();
            let addr = e.local_tcp_addr().map_or(addr, MetricsAddr::Tcp);
            std::thread::scope(|s| {
                s.spawn(|| {
                    e.serve(
                        || stop.load(Ordering::SeqCst),
                        || "zeronce_x_total 1\n".into(),
                    )
                });
                assert_eq!(scrape(&addr).unwrap(), "zeronce_x_total 1\n");
                stop.store(true, Ordering::SeqCst);
            });
            stop.store(false, Ordering::SeqCst);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
