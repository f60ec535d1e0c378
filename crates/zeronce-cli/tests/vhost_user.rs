//! zeronce's own driver against the device in a `zeronce serve` process, over vhost-user:
//! the VM-mode demo and the report-path benchmark through that topology.

use std::process::Command;

fn zeronce(args: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(args.split_whitespace())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the zeronce binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`zeronce {args}`: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn vm_demo_over_vhost_user_reports_and_gets_blocks_back_known_zero() {
    let out = zeronce("demo --mode vm --topology vhost-user --size-mib 256 --working-set-mib 32");
    assert!(out.contains("over vhost-user"), "{out}");
    let reported = out
        .lines()
        .find(|l| l.starts_with("3. reported"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(reported.contains("allocated      0 MiB"), "{reported}");
    assert!(
        out.contains("16 of step 1's blocks known zero from the host"),
        "{out}"
    );
    assert!(
        out.contains("device (steps 0-4), since it started (its control socket)"),
        "{out}"
    );
    assert!(
        out.contains("second device (step 5's own, bit 6 off), since it started"),
        "{out}"
    );
    // The last block written splits a 4 MiB block; freed, it merges with its never-written
    // half, which is reported again.
    assert!(
        out.contains("(2 MiB more than the 32 MiB working set: never-written free memory"),
        "{out}"
    );
}

#[test]
fn report_path_measures_all_three_paths() {
    let out = zeronce("bench report-path --quick --json --size-mib 32 --runs 1");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    for path in ["process", "vm_thread", "vm_vhost_user"] {
        let bytes = v["paths"][path]["bytes_reported"].as_u64().unwrap_or(0);
        assert!(bytes >= 32 << 20, "{path} reported {bytes} bytes: {v}");
    }
    assert!(
        v["ratio_vhost_user_over_process"].as_f64().unwrap() > 0.0,
        "{v}"
    );
}

#[test]
fn vhost_user_topology_needs_vm_mode() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(["demo", "--topology", "vhost-user"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --mode vm"));
}

/// A `zeronce serve` killed (SIGKILL) while the guest uses it: the transport sees the
/// socket hang up, and the next report fails at once with that reason instead of waiting
/// out the driver's timeout (a minute here: without the hang-up watch the report times
/// out and the test fails on the reason).
#[test]
fn a_back_end_killed_mid_use_fails_the_driver_with_the_reason_not_the_timeout() {
    use std::sync::Arc;
    use std::time::Duration;
    use zeronce::zeronce_balloon_driver::DriverOptions;
    use zeronce::{DeviceHost, Order, ReportingConfig, VmMemory};
    use zeronce_vhost::{ServeProcess, VhostUserTransport};

    let dir = std::env::temp_dir().join(format!("zeronce-killed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("balloon.sock");
    let daemon = ServeProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_zeronce")),
        &socket,
        &["--zero-hints"],
    )
    .unwrap();
    let s = socket.clone();
    let vm = VmMemory::builder()
        .size(64 << 20)
        .reporting(ReportingConfig {
            delay: Duration::from_secs(3600),
            watermark_gate: false,
            ..ReportingConfig::default()
        })
        .driver(DriverOptions {
            timeout: Duration::from_secs(60),
            ..DriverOptions::default()
        })
        .device(DeviceHost::External(Arc::new(move |ram, size, irq| {
            Ok(Box::new(VhostUserTransport::connect(&s, ram, size, irq)?) as _)
        })))
        .build()
        .unwrap();
    let first = vm.flush(u64::MAX);
    assert!(first.error.is_none(), "{first:?}");
    let blocks: Vec<_> = (0..4)
        .map(|_| vm.alloc(Order::new(9).unwrap()).unwrap())
        .collect();
    drop(blocks);
    daemon.kill().unwrap();
    let r = vm.flush(u64::MAX);
    let e = r.error.expect("a report to a killed back-end succeeded");
    assert!(
        e.to_string().contains("closed its socket"),
        "not the hang-up: {e}"
    );
    assert!(vm.driver_broken());
    drop(vm);
    let _ = std::fs::remove_dir_all(&dir);
}
