//! What the `zeronce` program prints for people and for tools: `demo --json` is one JSON
//! object with every step, `--plot` writes a well-formed SVG, `--help` says what the
//! program is.

use std::process::Command;

fn zeronce(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(args)
        .output()
        .expect("run the zeronce binary")
}

/// Minimal well-formedness: one root `<svg>` element, every opened element closed.
fn assert_well_formed_svg(svg: &str) {
    let body = svg.trim();
    let body = body
        .strip_prefix("<?xml")
        .map_or(body, |rest| {
            &rest[rest.find("?>").expect("xml declaration") + 2..]
        })
        .trim();
    assert!(
        body.starts_with("<svg") && body.ends_with("</svg>"),
        "{body:.100}"
    );
    let mut open = Vec::new();
    let mut rest = body;
    while let Some(lt) = rest.find('<') {
        let gt = rest[lt..].find('>').expect("unterminated tag") + lt;
        let tag = &rest[lt + 1..gt];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name.trim().to_string()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') && !tag.starts_with('!') && !tag.starts_with('?') {
            open.push(tag.split_whitespace().next().unwrap_or("").to_string());
        }
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
}

#[test]
fn demo_json_has_every_step_and_plot_is_an_svg() {
    let dir = std::env::temp_dir().join(format!("zeronce-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("demo.svg");
    let out = zeronce(&[
        "demo",
        "--size-mib",
        "128",
        "--working-set-mib",
        "8",
        "--delay-ms",
        "100",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    let steps = v["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 5, "{v}");
    assert_eq!(steps[3]["blocks_known_zero"], 4, "{v}");
    assert!(
        v["reporting"]["pages_reported"].as_u64() >= Some(2048),
        "{v}"
    );
    assert!(!stdout.contains("seed"));
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_well_formed_svg(&text);
    assert!(text.contains("freed") && text.contains("reported"));
}

#[test]
fn help_says_what_the_program_is_without_jargon() {
    let out = zeronce(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("gives free memory back to the host"),
        "{help}"
    );
    for sub in [&["bench", "--help"][..], &["demo", "--help"]] {
        let h = String::from_utf8_lossy(&zeronce(sub).stdout).to_lowercase();
        assert!(!h.contains("seed"), "{h}");
    }
}
